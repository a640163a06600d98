"""Terminology constraints end to end: the trained reversal model over its whole dev set
(Python API, SavedModel, translate CLI), and the compiled search with XLA, a shortlist and int8
weights on a random model."""

import re
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf

import tf_transformer
from data_pipeline.token_ids import PAD_ID
from tests import testutil
from tests.tf_transformer.serving.translator_test import TEXTS, no_candidates_lexicon
from tf_transformer import checkpoints, decoding
from tf_transformer.decoding import shortlist
from tf_transformer.config import DecodeConfig
from tf_transformer.decoding.lexical_constraints import ConstraintError, Constraints
from tf_transformer.serving import constraint_requests
from tf_transformer.serving.translator import Translator

SEARCH = dict(beam_size=2, max_source_length=10, extra_decode_length=5)  # the export's


def words_of(text):
  return text.split()


def has_phrase(text, phrase):
  """Whether `phrase` is in `text` as whole words."""
  words, wanted = words_of(text), words_of(phrase)
  return any(words[i:i + len(wanted)] == wanted for i in range(len(words) - len(wanted) + 1))


def dev_constraints(sources, plain):
  """For each sentence, a term its plain translation lacks (the first task word missing; two
  of them as one phrase in odd rows) and, to avoid, the first word of that translation."""
  constraints = []
  for row, output in enumerate(plain):
    missing = [f"w{n}" for n in range(testutil.TASK_WORDS) if f"w{n}" not in words_of(output)]
    term = " ".join(missing[:2]) if row % 2 else missing[0]
    constraints.append([term, "!" + words_of(output)[0]])
  return constraints


@pytest.fixture(scope="module")
def reversal(reversal_model):
  model_dir, dev, _ = reversal_model
  model = tf_transformer.load(str(model_dir), **SEARCH)
  sources = [source for source, _ in dev]
  plain = model.translate(sources)
  return model, sources, plain, dev_constraints(sources, plain)


def test_every_output_over_the_dev_set_has_its_terms_and_none_it_must_avoid(reversal):
  model, sources, _, constraints = reversal
  nbest = model.translate(sources, nbest=2, constraints=constraints)
  for hypotheses, (term, avoided) in zip(nbest, constraints):
    for hypothesis in hypotheses:
      assert has_phrase(hypothesis.text, term), (term, hypothesis.text)
      assert avoided[1:] not in words_of(hypothesis.text), (avoided, hypothesis.text)


def test_a_constrained_output_scores_as_its_forced_decoding(reversal_model, reversal):
  """Each score is the model's own log-probability of the pieces searched (over the length
  penalty), terms and banned phrases notwithstanding."""
  _, sources, _, constraints = reversal
  model, vocabulary, _ = checkpoints.load_for_inference(str(reversal_model[0]), "src", "tgt")
  search = DecodeConfig(beam_size=2, alpha=0.6, extra_decode_length=5)
  translator = Translator(model, vocabulary, search)
  source_ids = translator._source_ids(tf.constant(sources))
  lines = tf.constant(["\t".join(phrases) for phrases in constraints])
  constraints = constraint_requests.constraints_of(translator._constraint_pieces(lines),
                                                  translator._word_inside)
  ids, scores = decoding.decode(model, source_ids, search, constraints=constraints)
  forced = decoding.score(model, tf.repeat(source_ids, 2, axis=0),
                          tf.reshape(ids, [len(sources) * 2, -1]), alpha=0.6)
  np.testing.assert_allclose(scores.numpy().ravel(), forced.numpy(), rtol=1e-4)


def test_no_constraints_translate_as_plain_translation_byte_for_byte(reversal):
  model, sources, _, _ = reversal
  want = model.translate(sources, nbest=2)
  got = model.translate(sources, nbest=2, constraints=[[] for _ in sources])
  assert [[h.text for h in hs] for hs in got] == [[h.text for h in hs] for hs in want]
  assert [[h.score for h in hs] for hs in got] == [[h.score for h in hs] for hs in want]


def test_a_model_ensembled_with_itself_translates_under_constraints_as_the_model(
    reversal_model, reversal):
  """The ensemble's search (the weighted mean of log-probabilities, not renormalised) meets
  the same terms with the same outputs and scores as its one member."""
  model, sources, _, constraints = reversal
  model_dir = str(reversal_model[0])
  itself = tf_transformer.load([model_dir, model_dir], **SEARCH)
  want = model.translate(sources, nbest=2, constraints=constraints)
  got = itself.translate(sources, nbest=2, constraints=constraints)
  assert [[h.text for h in hs] for hs in got] == [[h.text for h in hs] for hs in want]
  np.testing.assert_allclose([[h.score for h in hs] for hs in got],
                             [[h.score for h in hs] for hs in want], rtol=1e-5)


def test_the_saved_model_translates_under_constraints_as_the_model_directory(reversal,
                                                                            reversal_export):
  model, sources, plain, constraints = reversal
  exported = tf_transformer.load(str(reversal_export))
  testutil.assert_translate_alike(exported, model, sources, nbest=2, constraints=constraints)
  # with a target prefix too: the output's first word forced, then the terms
  prefixes = [words_of(output)[-1] for output in plain]
  constraints = [[term] for term, _ in constraints]
  testutil.assert_translate_alike(exported, model, sources, nbest=2, constraints=constraints,
                                  target_prefix=prefixes)
  for output, prefix, (term,) in zip(
      exported.translate(sources, constraints=constraints, target_prefix=prefixes), prefixes,
      constraints):
    assert output.startswith(prefix) and has_phrase(output, term), (prefix, term, output)


def test_constraints_that_cannot_be_met_name_their_sentence(reversal_model):
  model = tf_transformer.load(str(reversal_model[0]), max_constraint_tokens=4, **SEARCH)
  sources = ["w1 w2", "w3 w4 w5"]
  cases = [
      ([[], ["w1", " "]], "sentence 2: ' ' is not a phrase"),
      ([[], ["w1\tw2"]], "sentence 2: 'w1\\\\tw2' is not a phrase"),
      ([["w1 w2", "w3"], []], r"^the constraints of sentence 1: more subword pieces to "
       r"include than max_constraint_tokens=4$"),
      ([["w1", "w3"], []], None),  # 4 pieces: as many as allowed, and they fit
      ([["!w1 w2 w3 w4 w5"], []], "sentence 1: a phrase to avoid of more subword pieces"),
  ]
  for constraints, message in cases:
    if message is None:
      model.translate(sources, constraints=constraints)
      continue
    with pytest.raises(ConstraintError, match=message):
      model.translate(sources, constraints=constraints)
  short = tf_transformer.load(str(reversal_model[0]), beam_size=2, extra_decode_length=1)
  with pytest.raises(ConstraintError, match="sentence 6: more subword pieces to include .*"
                     "than the length limit of the output"):
    # batched by length, the short third sentence comes first: its number is still its own
    short.translate(["w1 w2 w3 w4", "w1 w2 w3 w4", "w1"], constraints=[["w2 w3"]] * 3,
                    first_index=3)


def test_translate_constraints_file_and_its_one_line_errors(reversal_model, tmp_path):
  model_dir = str(reversal_model[0])
  testutil.write_lines(tmp_path / "in.txt", ["w1 w2 w3", "", "w4 w5"])
  testutil.write_lines(tmp_path / "terms.txt", ["w9", "", "w7\t!w5"])
  common = ("--flagfile=flags/tiny.cfg", f"--model_dir={model_dir}", "--src_lang=src",
            "--tgt_lang=tgt", f"--input={tmp_path / 'in.txt'}", "--beam_size=2")
  result = testutil.run_cli("tf_transformer.bin.translate", *common,
                            f"--constraints={tmp_path / 'terms.txt'}")
  assert result.returncode == 0, result.stderr
  first, blank, third = result.stdout.splitlines()
  assert has_phrase(first, "w9") and blank == ""
  assert has_phrase(third, "w7") and "w5" not in words_of(third)
  testutil.write_lines(tmp_path / "bad.txt", ["w9", "", "w7\t\tw8"])
  result = testutil.run_cli("tf_transformer.bin.translate", *common,
                            f"--constraints={tmp_path / 'bad.txt'}")
  testutil.assert_one_line_error(result, f"error: {tmp_path / 'bad.txt'}:3: '' is not a "
                                 "phrase (empty, or with a tab or line break)")


# phrases of the random model's pieces: two to include (one of two words), one to avoid
CONSTRAINTS = ["zz", "yy xx\t!vv", "", "ww\tuu", "tt"]


def test_xla_shortlist_and_int8_searches_meet_the_constraints_as_the_graph(tiny_model_dir):
  """The compiled search (shape buckets, constraints padded to one of two widths) finds
  what the graph finds; a shortlist that holds none of the terms' pieces gets them; in int8
  (the searches of every precision are one code but for their matrix products)."""
  precision = "int8"
  _, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
  search = DecodeConfig(beam_size=3, nbest=3, extra_decode_length=4, max_constraint_tokens=8)
  texts, constraints = tf.constant(TEXTS), tf.constant(CONSTRAINTS)
  lexicon = no_candidates_lexicon(vocabulary)
  results = []
  for decode_jit, size in ((False, 0), (True, 0), (False, 8), (True, 8)):
    # converted in place to `precision`: a model each
    model, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
    translator = Translator(model, vocabulary, replace(search, decode_jit=decode_jit),
                            precision=precision, shortlist_size=size, lexicon=lexicon)
    results.append(translator.translate_constrained(texts, constraints))
  for result in results:
    for row, (text, line) in enumerate(zip(TEXTS, CONSTRAINTS)):
      outputs = [o.decode() for o in result["outputs"][row].numpy()]
      for phrase in (line.split("\t") if line and text.strip() else []):
        for output in outputs:
          if phrase.startswith("!"):
            assert phrase[1:] not in words_of(output), (phrase, output)
          else:
            assert has_phrase(output, phrase), (phrase, output)
  for graph, xla in (results[:2], results[2:]):
    np.testing.assert_array_equal(xla["outputs"].numpy(), graph["outputs"].numpy())
    np.testing.assert_allclose(xla["scores"].numpy(), graph["scores"].numpy(), rtol=1e-5)
  # the terms' pieces are outside each sentence's shortlist unless forced into it
  source_ids = Translator(model, vocabulary)._source_ids(texts)
  unforced = shortlist.select(lexicon.table, lexicon.order, source_ids, 8).numpy()
  terms = vocabulary.target.tokenize(tf.constant(["zz", "yy xx", "ww", "uu", "tt"]))
  assert set(terms.flat_values.numpy()) - set(unforced.ravel()) - {PAD_ID}



def test_the_compiled_search_runs_at_two_constraint_widths(tiny_model_dir):
  """Under XLA, constraints whose pieces to include, phrases to avoid and pieces of one all fit
  NARROW_CONSTRAINTS run at that width, any wider at max_constraint_tokens: two compilations
  for a batch and source bucket, whatever the widths."""
  model, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
  search = DecodeConfig(beam_size=2, extra_decode_length=20, decode_jit=True,
                        max_constraint_tokens=16)
  translator = Translator(model, vocabulary, search)
  source_ids = translator._source_ids(tf.constant(["aa bb", "cc"]))
  for count, banned in [(1, (0, 0)), (8, (1, 3)), (3, (8, 8)), (9, (0, 0)), (2, (1, 16)),
                        (16, (16, 16)), (0, (0, 0))]:
    constraints = Constraints(tf.fill([2, count], 5), tf.zeros([2, count], tf.bool),
                              tf.fill([2, *banned], 6))
    translator._decode(source_ids, constraints=constraints)
  assert translator._searches.value.functions["beam"].experimental_get_tracing_count() == 2


def test_the_signature_refuses_constraints_that_cannot_be_met_naming_the_row(tiny_model_dir):
  """What a TF Serving client sending raw lines gets: the request fails, naming its row."""
  model, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
  translator = Translator(model, vocabulary, DecodeConfig(extra_decode_length=1,
                                                          max_constraint_tokens=4))
  # limits of 2 + 1 + 1 and 6 + 1 + 1 pieces (EOS included); a word below is one piece
  texts = tf.constant(["aa bb", "cc dd ee ff gg hh"])
  assert vocabulary.target.tokenize(tf.constant(["zz yy xx ww vv"])).flat_values.shape == [5]
  cases = [(["", "zz\t\tyy"], "an empty phrase in row] [1]"),
           (["!", ""], "a phrase of no subword piece in row] [0]"),
           (["", "zz\tÜ"], "a phrase to include with a character the target vocabulary lacks "
            "in row] [1]"),
           (["", "zz yy xx ww vv"], "more subword pieces to include than "
            "max_constraint_tokens=4 in row] [1]"),
           (["zz yy xx ww", ""], "than the length limit of the output in row] [0]")]
  for lines, message in cases:
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(message)):
      translator.translate_constrained(texts, tf.constant(lines))


def test_a_prefix_as_long_as_a_fixed_output_limit_is_no_error_without_terms_to_include(
    tiny_model_dir):
  """The export's warm-ups send long val sentences as prefixes: with a fixed
  --max_decode_length and nothing to include, the prefix is cut at the limit, as
  translate_prefix cuts it, instead of failing the request (and TF Serving's load)."""
  model, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
  translator = Translator(model, vocabulary, DecodeConfig(max_decode_length=3))
  texts = tf.constant(["aa bb", "cc"])
  prefixes = tf.constant(["zz yy xx ww vv", ""])
  assert vocabulary.target.tokenize(prefixes[:1]).flat_values.shape[0] > 3
  plain = translator.translate_prefix(texts, prefixes)
  unconstrained = translator.translate_constrained_prefix(texts, tf.constant(["", "!zz"]),
                                                          prefixes)
  assert plain["outputs"].numpy()[0].tolist() == unconstrained["outputs"].numpy()[0].tolist()
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=re.escape("than the length limit of the output in row] [0]")):
    translator.translate_constrained_prefix(texts, tf.constant(["zz", ""]), prefixes)
