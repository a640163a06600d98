"""The SavedModel contract (tf_transformer/serving/signatures.py) against what a Translator
serves and what docs/serving.md says."""

import pathlib

import pytest
import tensorflow as tf

from tf_transformer import checkpoints
from tf_transformer.config import DecodeConfig
from tf_transformer.serving import signatures
from tf_transformer.serving.translator import Translator

_DOCS = pathlib.Path(__file__).parents[3] / "docs" / "serving.md"


def test_docs_show_the_contracts_tables():
  assert signatures.markdown_table() in _DOCS.read_text()


def test_a_translator_serves_the_contract(tiny_model_dir):
  model, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
  translator = Translator(model, vocabulary, DecodeConfig(beam_size=3, decode_jit=False))
  served = translator.signatures()
  assert list(served) == list(signatures.NAMES)
  for signature in signatures.SIGNATURES:
    function = served[signature.name]
    # (positional in the module, keywords once saved: the names are the specs')
    inputs = tf.nest.flatten(function.structured_input_signature)
    assert [(spec.name, spec.dtype, spec.shape.as_list()) for spec in inputs] == [
        (tensor.name, tensor.dtype, [None]) for tensor in signature.inputs], signature.name
    outputs = function.structured_outputs
    assert {name: (spec.dtype, spec.shape.rank) for name, spec in outputs.items()} == {
        tensor.name: (tensor.dtype, tensor.shape.count(",") + 1)
        for tensor in signature.outputs}, signature.name
  # positional calls take the contract's order: a prefix where the prefix goes
  texts, prefixes = tf.constant(["aa bb", "cc"]), tf.constant(["", "dd"])
  by_order = translator.translate_prefix(texts, prefixes)
  by_name = signatures.call(served["translate_prefix"], "translate_prefix", texts, prefixes)
  assert by_order["outputs"].numpy().tolist() == by_name["outputs"].numpy().tolist()


def test_the_batched_signatures_are_those_whose_outputs_keep_a_rows_width():
  # align's outputs are as wide as the longest input of its batch: merging would widen them
  assert set(signatures.NAMES) - set(signatures.BATCHED) == {"align"}
  assert set(signatures.COMPILING) <= set(signatures.BATCHED)



# Of the tiny model: one subword piece a word of these, each at most 3 bytes with its space
_LIMIT = 4
_WORDS = ["aa", "bb", "cc"] * 400


def _words(count):
  return " ".join(_WORDS[:count])


# Texts one per row: within the limit; exactly at it; one piece over it; at the limit with
# white space past the bytes read (nothing cut); one word past them (cut, though within the
# pieces). 128 x _LIMIT bytes are read of a row.
_ROW_TEXTS = [_words(2), _words(_LIMIT), _words(_LIMIT + 1), "aa" + " " * 600,
              "aa" + " " * 600 + "bb"]
_ROW_CUT = [False, False, True, False, True]


@pytest.fixture(scope="module")
def limited_translator(tiny_model_dir):
  model, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
  return Translator(model, vocabulary, DecodeConfig(beam_size=2, extra_decode_length=2,
                                                    max_source_length=_LIMIT, decode_jit=False))


@pytest.mark.parametrize("name", signatures.NAMES)
def test_every_signature_reports_the_rows_of_each_text_input_it_cut(limited_translator, name):
  """`cut` is true exactly for the rows of which a text input (source, prefix or target: each
  in turn, the others short) was longer than what is read of it."""
  signature = signatures.BY_NAME[name]
  function = getattr(limited_translator, signature.method)
  texts = [tensor for tensor in signature.inputs if tensor.side]
  assert texts
  rows = len(_ROW_TEXTS)
  for cut_input in texts:
    arguments = []
    for tensor in signature.inputs:
      if tensor is cut_input:
        arguments.append(tf.constant(_ROW_TEXTS))
      elif tensor.side:
        arguments.append(tf.constant(["aa"] * rows))
      elif tensor.dtype == tf.int64:
        arguments.append(tf.range(rows, dtype=tf.int64))
      else:  # constraints: none
        arguments.append(tf.constant([""] * rows))
    outputs = function(*arguments)
    assert outputs["cut"].numpy().tolist() == _ROW_CUT, (name, cut_input.name)
