"""The string-to-string Translator: its XLA path pads batches to shape buckets and still
translates exactly like the graph path; large requests go in chunks."""

from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline import lexical_shortlist
from data_pipeline.token_ids import EOS_ID, PAD_ID
from tf_transformer import checkpoints, decoding
from tf_transformer.decoding import shortlist
from tf_transformer.config import DataConfig, DecodeConfig
from tf_transformer.serving.translator import Translator

# the reversal model's shortlist, of its 20 pieces: EOS and up to 8 lexical pieces (a sentence
# of 6 numbers, "▁w" and its candidates' most frequent number), and the candidates per source
# piece
REVERSAL_SHORTLIST, REVERSAL_PER_SOURCE = 9, 2

# 5 sentences (a batch bucket of 8) of 1 to 9 tokens (a width bucket of 16)
TEXTS = ["aa", "bb cc dd", "ee ff gg hh ii", "", "jj kk ll mm nn oo pp qq"]


@pytest.fixture(scope="module")
def model_and_vocabulary(tiny_model_dir):
  model, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
  return model, vocabulary


def _source_ids(model, vocabulary, texts):
  """int32 [B, S]: the source ids a Translator decodes for `texts` (string [B])."""
  return Translator(model, vocabulary)._source_ids(texts)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_xla_with_shape_buckets_translates_like_the_graph(model_and_vocabulary, beam_size):
  model, vocabulary = model_and_vocabulary
  search = DecodeConfig(beam_size=beam_size, nbest=beam_size, extra_decode_length=4)
  graph_translator = Translator(model, vocabulary, search)
  xla_translator = Translator(model, vocabulary, replace(search, decode_jit=True))
  graph = graph_translator.translate_nbest(tf.constant(TEXTS))
  xla = xla_translator.translate_nbest(tf.constant(TEXTS))
  assert xla["outputs"].shape == graph["outputs"].shape == (len(TEXTS), beam_size)
  # the random model rarely ends early: outputs run to the length limit, which the wider
  # buffers of the bucket must not move
  np.testing.assert_array_equal(xla["outputs"].numpy(), graph["outputs"].numpy())
  np.testing.assert_allclose(xla["scores"].numpy(), graph["scores"].numpy(), rtol=1e-5)


def test_xla_batches_of_many_shapes_share_a_few_compilations(model_and_vocabulary):
  model, vocabulary = model_and_vocabulary
  translator = Translator(model, vocabulary, DecodeConfig(beam_size=2, nbest=2,
                                                         extra_decode_length=3, decode_jit=True))
  for batch, width in [(3, 5), (4, 9), (4, 16), (2, 2), (5, 17), (8, 30)]:
    ids = tf.fill([batch, width], 7)
    ids, scores = translator._decode(ids)
    assert ids.shape[:2] == (batch, 2) and scores.shape == (batch, 2)
  # (4, 16): 3 and 4 sentences of up to 16 tokens; (2, 16); (8, 32): 5 and 8 of 17 to 30
  assert translator._searches.value.functions["beam"].experimental_get_tracing_count() == 3


@pytest.mark.parametrize("decode_jit", [False, True])
def test_large_requests_decode_in_chunks_like_one_batch(model_and_vocabulary, decode_jit):
  model, vocabulary = model_and_vocabulary
  search = DecodeConfig(beam_size=2, nbest=2, extra_decode_length=4, decode_jit=decode_jit)
  whole = Translator(model, vocabulary, search)
  chunked = Translator(model, vocabulary, search, max_batch_size=2)  # chunks of 2, 2 and 1
  texts = tf.constant(TEXTS)
  for name in ("translate_nbest", "serve"):
    expected, got = getattr(whole, name)(texts), getattr(chunked, name)(texts)
    np.testing.assert_array_equal(got["outputs"].numpy(), expected["outputs"].numpy())
    np.testing.assert_allclose(got["scores"].numpy(), expected["scores"].numpy(), rtol=1e-5)
  np.testing.assert_allclose(chunked.score(texts, texts)["log_prob"].numpy(),
                             whole.score(texts, texts)["log_prob"].numpy(), rtol=1e-5)
  empty = tf.constant([], tf.string)
  assert chunked.translate_nbest(empty)["outputs"].shape == (0, 2)
  assert chunked.score(empty, empty)["log_prob"].shape == (0,)


# a prefix longer than its source's length limit (source tokens + extra_decode_length), one
# of one piece, one empty, one for a blank input, one of several pieces
PREFIXES = ["vv ww xx yy zz vv ww", "xx", "", "yy", "zz zz zz"]


def test_forced_prefix_ids_score_as_forced_decoding(model_and_vocabulary):
  model, vocabulary = model_and_vocabulary
  source_ids = _source_ids(model, vocabulary, tf.constant(TEXTS[:3]))
  prefix_ids = vocabulary.target.tokenize(tf.constant(PREFIXES[:3])).to_tensor()
  ids, scores = decoding.decode(model, source_ids,
                                DecodeConfig(beam_size=3, alpha=0.6, extra_decode_length=4),
                                prefix_ids=prefix_ids)
  for row in range(3):
    prefix = [token for token in prefix_ids[row].numpy() if token != PAD_ID]
    for hypothesis, score in zip(ids[row].numpy(), scores[row].numpy()):
      assert list(hypothesis[:len(prefix)]) == prefix
      # up to EOS, or the whole hypothesis (a live one at the length limit, scored there)
      tokens = [token for token in hypothesis if token != PAD_ID]
      forced = decoding.score(model, source_ids[row:row + 1], tf.constant([tokens]), 0.6)
      assert score == pytest.approx(float(forced[0]), abs=1e-4)


@pytest.mark.parametrize("decode_jit", [False, True])
def test_translate_prefix_begins_each_translation_with_its_prefix(model_and_vocabulary,
                                                                  decode_jit):
  model, vocabulary = model_and_vocabulary
  translator = Translator(model, vocabulary, DecodeConfig(
      beam_size=3, nbest=3, alpha=0.6, extra_decode_length=4, decode_jit=decode_jit))
  texts, prefixes = tf.constant(TEXTS), tf.constant(PREFIXES)
  result = translator.translate_prefix(texts, prefixes)
  plain = translator.translate_nbest(texts)
  # the library's search over the same forced ids
  source_ids = _source_ids(model, vocabulary, texts)
  prefix_ids = vocabulary.target.tokenize(prefixes).to_tensor()
  _, want_scores = decoding.decode(model, source_ids,
                                   DecodeConfig(beam_size=3, alpha=0.6, extra_decode_length=4),
                                   prefix_ids=prefix_ids)
  for row, (text, prefix) in enumerate(zip(TEXTS, PREFIXES)):
    outputs = [output.decode() for output in result["outputs"][row].numpy()]
    if not text.strip():
      assert outputs == [""] * 3
      continue
    if not prefix:  # nothing forced: the plain translation
      np.testing.assert_array_equal(result["outputs"][row].numpy(), plain["outputs"][row].numpy())
    # pieces detokenize by concatenation: a translation begins with its prefix's text
    prefix_text = vocabulary.target.detokenize(prefix_ids[row:row + 1])[0].numpy().decode()
    assert all(output.startswith(prefix_text) for output in outputs), (prefix_text, outputs)
    np.testing.assert_allclose(result["scores"][row].numpy(), want_scores[row].numpy(),
                               rtol=1e-5)


def no_candidates_lexicon(vocabulary):
  """A Lexicon without lexical candidates (EOS only), the lowest ids the most frequent: a
  shortlist of n is EOS, the forced pieces, then ids 1 and up (PAD and BOS left out)."""
  table = np.full([vocabulary.source_size, 3], EOS_ID, np.int32)
  counts = np.arange(vocabulary.target_size)[::-1]
  return lexical_shortlist.Lexicon(table, lexical_shortlist.frequency_order(counts))


def _texts(tokenizer, ids):
  """int32 [B, K, L] hypotheses -> their texts, [B][K] str, as a Translator detokenizes them
  with its target `tokenizer`."""
  batch, beams = ids.shape[:2]
  flat = decoding.strip_after_eos(tf.reshape(ids, [batch * beams, -1]))
  texts = [text.decode() for text in tokenizer.detokenize(flat).numpy()]
  return [texts[row * beams:(row + 1) * beams] for row in range(batch)]


def _bites(model, source_ids, chosen, search, prefix_ids=None) -> bool:
  """Whether the search over the whole vocabulary writes, for some sentence, pieces outside
  its shortlist (a row of `chosen`, int32 [B, n])."""
  ids, _ = decoding.decode(model, source_ids, search, prefix_ids)
  return any(set(row_ids.ravel()) - set(row_chosen) - {PAD_ID}
             for row_ids, row_chosen in zip(ids.numpy(), chosen.numpy()))


def _assert_static_search_finds(translator, inputs, want_ids, want_scores):
  """The XLA `translator`'s search, called directly on `inputs` (source ids, and prefix ids
  or not) of static shapes, finds `want_ids` (int32 [B, K, L]) with `want_scores` (float32
  [B, K]). Called before any of its signatures: their search, traced for a batch of any shape,
  would serve the call (and the static bucket's shortlist would go untested)."""
  ids, scores = translator._decode(*inputs)
  tokenizer = translator.target_tokenizer
  assert _texts(tokenizer, ids) == _texts(tokenizer, want_ids)
  np.testing.assert_allclose(scores.numpy(), want_scores.numpy(), rtol=1e-5)


# 8 of the 57 pieces a sentence, which its prefix's pieces (up to 5) must enter
FORCED_SHORTLIST = 8


@pytest.mark.parametrize("decode_jit", [False, True])
def test_translate_prefix_forces_pieces_outside_the_shortlist(model_and_vocabulary, decode_jit):
  """translate_prefix searches each sentence's shortlist with its prefix's pieces in it (no
  lexicon candidate or frequency puts them there): the library's search over those
  shortlists, its scores log-probabilities of the shortlist; under XLA a direct call of the
  search on a batch of static shape too."""
  model, vocabulary = model_and_vocabulary
  lexicon = no_candidates_lexicon(vocabulary)
  search = DecodeConfig(beam_size=3, alpha=0.6, extra_decode_length=4)
  translator = Translator(model, vocabulary, replace(search, nbest=3, decode_jit=decode_jit),
                          shortlist_size=FORCED_SHORTLIST, lexicon=lexicon)
  texts, prefixes = tf.constant(TEXTS), tf.constant(PREFIXES)
  prefix_ids = vocabulary.target.tokenize(prefixes).to_tensor()
  source_ids = _source_ids(model, vocabulary, texts)
  size = FORCED_SHORTLIST
  chosen = shortlist.select(lexicon.table, lexicon.order, source_ids, size, prefix_ids)
  unforced = shortlist.select(lexicon.table, lexicon.order, source_ids, size).numpy()
  for row_prefix, row_chosen, row_unforced in zip(prefix_ids.numpy(), chosen.numpy(), unforced):
    assert set(row_prefix) - {PAD_ID} <= set(row_chosen)
  # they would be left out
  assert set(prefix_ids.numpy().ravel()) - {PAD_ID} - set(unforced.ravel())
  assert _bites(model, source_ids, chosen, search, prefix_ids)
  want_ids, want_scores = decoding.decode(model, source_ids, search, prefix_ids=prefix_ids,
                                          shortlist=chosen)
  if decode_jit:
    _assert_static_search_finds(translator, (source_ids, prefix_ids), want_ids, want_scores)
  result = translator.translate_prefix(texts, prefixes)
  for row, (text, want) in enumerate(zip(TEXTS, _texts(vocabulary.target, want_ids))):
    if not text.strip():
      continue
    prefix_text = vocabulary.target.detokenize(prefix_ids[row:row + 1])[0].numpy().decode()
    outputs = [output.decode() for output in result["outputs"][row].numpy()]
    assert all(output.startswith(prefix_text) for output in outputs), (prefix_text, outputs)
    assert outputs == want
    np.testing.assert_allclose(result["scores"][row].numpy(), want_scores[row].numpy(),
                               rtol=1e-5)
  # scored as log-probabilities of the shortlist, not as masked-out tokens (about -1e9)
  assert (result["scores"].numpy() > -100).all()


# 4 of the 57 pieces a sentence
XLA_SHORTLIST = 4


@pytest.mark.parametrize("beam_size", [1, 3])
def test_xla_with_a_shortlist_translates_like_the_graph(model_and_vocabulary, beam_size):
  """Both paths search each sentence's shortlist of XLA_SHORTLIST pieces, the library's search
  over them (the XLA path's copies of the first row and padding change none), and so does a
  direct call of XLA's search on a batch of static shape."""
  model, vocabulary = model_and_vocabulary
  rng = np.random.default_rng(0)
  table = rng.integers(4, vocabulary.target_size, size=(vocabulary.source_size, 4))
  lexicon = lexical_shortlist.Lexicon(table.astype(np.int32), lexical_shortlist.frequency_order(
      rng.integers(0, 100, vocabulary.target_size)))
  search = DecodeConfig(beam_size=beam_size, alpha=0.6, extra_decode_length=4)
  translators = dict(shortlist_size=XLA_SHORTLIST, lexicon=lexicon)
  source_ids = _source_ids(model, vocabulary, tf.constant(TEXTS))
  chosen = shortlist.select(lexicon.table, lexicon.order, source_ids, XLA_SHORTLIST)
  assert _bites(model, source_ids, chosen, search)
  want_ids, want_scores = decoding.decode(model, source_ids, search, shortlist=chosen)
  # (held: a tf.function method holds its module weakly)
  search = replace(search, nbest=beam_size)
  graph_translator = Translator(model, vocabulary, search, **translators)
  xla_translator = Translator(model, vocabulary, replace(search, decode_jit=True), **translators)
  _assert_static_search_finds(xla_translator, (source_ids,), want_ids, want_scores)
  graph = graph_translator.translate_nbest(tf.constant(TEXTS))
  xla = xla_translator.translate_nbest(tf.constant(TEXTS))
  np.testing.assert_array_equal(xla["outputs"].numpy(), graph["outputs"].numpy())
  np.testing.assert_allclose(xla["scores"].numpy(), graph["scores"].numpy(), rtol=1e-5)
  want = _texts(vocabulary.target, want_ids)
  for row, text in enumerate(TEXTS):
    if text.strip():
      assert [output.decode() for output in graph["outputs"][row].numpy()] == want[row]
      np.testing.assert_allclose(graph["scores"][row].numpy(), want_scores[row].numpy(),
                                 rtol=1e-5)


@pytest.fixture(scope="module")
def reversal_lexicon(reversal_model):
  """The lexicon of the reversal model's training data (its data folder: the model's parent)."""
  model_dir = reversal_model[0]
  _, vocabulary, _ = checkpoints.load_for_inference(str(model_dir), "src", "tgt")
  config = DataConfig(data_dir=str(model_dir.parent), src_lang="src", tgt_lang="tgt")
  return lexical_shortlist.from_training_data(config, vocabulary, REVERSAL_PER_SOURCE)


@pytest.mark.parametrize("precision", ["float32", "int8", "bfloat16"])
def test_a_shortlist_translates_the_reversal_task_as_the_whole_vocabulary(
    reversal_model, reversal_lexicon, precision):
  """One sentence a request: a shortlist holds its words (the 2 candidates of a number piece
  are itself and "▁w"), not the task's 13 numbers."""
  model_dir, dev, _ = reversal_model
  outputs, scores = [], []
  for size in (0, REVERSAL_SHORTLIST):
    # converted in place to `precision`: a model each
    model, vocabulary, _ = checkpoints.load_for_inference(str(model_dir), "src", "tgt")
    translator = Translator(model, vocabulary,
                            DecodeConfig(beam_size=2, nbest=2, extra_decode_length=5),
                            precision=precision, shortlist_size=size, lexicon=reversal_lexicon)
    best = [translator.serve(tf.constant([source])) for source, _ in dev]
    outputs.append([result["outputs"][0].numpy().decode() for result in best])
    scores.append(np.array([result["scores"][0].numpy() for result in best]))
  # the shortlist was searched: its scores, normalised over its pieces, are higher
  assert (scores[1] > scores[0]).all(), scores[1] - scores[0]
  # the whole dev set in one request: each sentence searches its own shortlist, as alone
  # (one shortlist for all would have scores normalised over more pieces, or crowd some out)
  together = translator.serve(tf.constant([source for source, _ in dev]))
  assert [output.decode() for output in together["outputs"].numpy()] == outputs[1]
  # bfloat16 keeps 8 significant bits, and a batch of another shape may round its products
  # otherwise (a Zen 5's kernels: 3e-3 relative): two units in its last place
  tolerance = 2.0**-7 if precision == "bfloat16" else 1e-5
  np.testing.assert_allclose(together["scores"].numpy(), scores[1], rtol=tolerance,
                             atol=1e-5)
  # the dev set writes more pieces than a shortlist holds
  written = vocabulary.target.tokenize(tf.constant([target for _, target in dev])).flat_values
  assert len(set(written.numpy()) | {EOS_ID}) > REVERSAL_SHORTLIST
  assert outputs[1] == outputs[0]
  reversed_rows = sum(output.split() == source.split()[::-1]
                      for output, (source, _) in zip(outputs[0], dev))
  assert reversed_rows >= len(dev) // 2


@pytest.mark.parametrize("decode_jit", [False, True])
def test_the_sample_signatures_draw_what_decode_draws_in_any_batch(model_and_vocabulary,
                                                                  decode_jit):
  """`sample` gives decode's draws for each row's seed, whatever the chunks and XLA's shape
  buckets; `sample_prefix` forces its prefixes; a blank input is "" with score 0."""
  model, vocabulary = model_and_vocabulary
  search = DecodeConfig(sampling_topk=6, sampling_temperature=0.9, extra_decode_length=4,
                        decode_jit=decode_jit)
  translator = Translator(model, vocabulary, search, max_batch_size=2)
  seeds = tf.constant([3, 1, 4, 1, 5], tf.int64)
  result = translator.sample(tf.constant(TEXTS), seeds)
  source_ids = _source_ids(model, vocabulary, tf.constant(TEXTS))
  ids, scores = decoding.decode(model, source_ids, replace(search, strategy="sample"),
                                seeds=seeds)
  want = [row[0] for row in _texts(vocabulary.target, ids)]
  assert [text.decode() for text in result["outputs"].numpy()] == [
      "" if not text else output for text, output in zip(TEXTS, want)]
  np.testing.assert_allclose(result["scores"].numpy(),
                             [0.0 if not text else s for text, s in zip(TEXTS, scores[:, 0])],
                             rtol=1e-5)
  alone = translator.sample(tf.constant(TEXTS[2:3]), seeds[2:3])
  assert alone["outputs"].numpy()[0] == result["outputs"].numpy()[2]
  prefixed = translator.sample_prefix(tf.constant(TEXTS), tf.constant(PREFIXES), seeds)
  for text, output, prefix in zip(TEXTS, prefixed["outputs"].numpy(), PREFIXES):
    assert output.decode().startswith(prefix) if text else not output
