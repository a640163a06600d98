"""Decoding the real model: the cached search agrees with full forward passes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_pipeline.lexical_shortlist import frequency_order
from data_pipeline.token_ids import BOS_ID, EOS_ID
from tests import testutil
from tf_transformer import decoding
from tf_transformer.decoding import shortlist
from tf_transformer.decoding.search_ops import length_penalty
from tf_transformer.config import DecodeConfig
from tf_transformer.model import Transformer

EXTRA = 6


@pytest.fixture(scope="module")
def model_and_sources():
  keras.utils.set_random_seed(3)
  model = Transformer(24, 24, num_layers=2, d_model=32, num_heads=4, d_ff=64)
  sources = tf.constant([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, 0, 0], [11, EOS_ID, 0, 0, 0]])
  return model, sources


def full_log_probs(model, source, prefix):
  """log-softmax over the next token after `prefix` (BOS first), by a full forward pass;
  PAD and BOS excluded, as decoding excludes them."""
  logits = model((source[tf.newaxis], tf.constant([prefix])), training=False)[0, -1]
  logits = logits.numpy().astype(np.float64)
  logits[[0, BOS_ID]] = -np.inf
  return testutil.log_softmax(logits)


def test_greedy_equals_full_recomputation(model_and_sources):
  model, sources = model_and_sources
  ids, _ = decoding.decode(model, sources, DecodeConfig(beam_size=1, extra_decode_length=EXTRA))
  for row, source in enumerate(sources):
    prefix = [BOS_ID]
    for _ in range(np.count_nonzero(source) + EXTRA):  # each sentence's own limit
      token = int(np.argmax(full_log_probs(model, source, prefix)))
      prefix.append(token)
      if token == EOS_ID:
        break
    assert list(ids[row, 0, :len(prefix) - 1].numpy()) == prefix[1:]


def test_beam_scores_equal_forced_decode_scores(model_and_sources):
  model, sources = model_and_sources
  alpha = 0.6
  ids, scores = decoding.decode(model, sources, DecodeConfig(
      beam_size=4, alpha=alpha, min_decode_length=3, extra_decode_length=EXTRA))
  for row, source in enumerate(sources):
    for hypothesis, score in zip(ids[row].numpy(), scores[row].numpy()):
      tokens = list(hypothesis)
      limit = np.count_nonzero(source) + EXTRA
      length = tokens.index(EOS_ID) + 1 if EOS_ID in tokens else limit
      assert not any(tokens[limit:])
      prefix, log_prob = [BOS_ID], 0.0
      for token in tokens[:length]:
        log_prob += full_log_probs(model, source, prefix)[token]
        prefix.append(token)
      np.testing.assert_allclose(score, log_prob / float(length_penalty(length, alpha)),
                                 rtol=1e-4)


def test_beam_is_at_least_as_good_as_greedy(model_and_sources):
  model, sources = model_and_sources
  _, greedy = decoding.decode(model, sources, DecodeConfig(beam_size=1, alpha=0.6,
                                                          extra_decode_length=EXTRA))
  _, beam = decoding.decode(model, sources, DecodeConfig(beam_size=4, alpha=0.6,
                                                        extra_decode_length=EXTRA))
  assert (beam[:, 0].numpy() >= greedy[:, 0].numpy() - 1e-5).all()


def test_score_equals_the_beam_search_score(model_and_sources):
  model, sources = model_and_sources
  ids, scores = decoding.decode(model, sources, DecodeConfig(
      beam_size=3, alpha=0.6, min_decode_length=2, extra_decode_length=EXTRA))
  for rank in range(3):
    targets = ids[:, rank]
    # forced decoding scores the same hypotheses, padded differently (trailing zeros)
    np.testing.assert_allclose(decoding.score(model, sources, targets, alpha=0.6),
                               scores[:, rank], rtol=1e-4)
    padded = tf.pad(targets, [[0, 0], [0, 3]])
    np.testing.assert_allclose(decoding.score(model, sources, padded, alpha=0.6),
                               scores[:, rank], rtol=1e-4)


def test_xla_compiled_search_decodes_the_same(model_and_sources):
  model, sources = model_and_sources
  config = DecodeConfig(beam_size=2, alpha=0.6, min_decode_length=2, extra_decode_length=EXTRA)
  search = lambda ids: decoding.decode(model, ids, config)
  ids, scores = tf.function(search)(sources)
  jit_ids, jit_scores = tf.function(search, jit_compile=True)(sources)
  np.testing.assert_array_equal(jit_ids.numpy(), ids.numpy())
  np.testing.assert_allclose(jit_scores.numpy(), scores.numpy(), rtol=1e-4)


def test_attention_of_the_best_hypothesis(model_and_sources):
  model, sources = model_and_sources
  ids, _ = decoding.decode(model, sources, DecodeConfig(beam_size=2, extra_decode_length=EXTRA))
  attention = decoding.attention(model, sources, ids[:, 0])
  assert attention.shape == (3, sources.shape[1] + EXTRA, sources.shape[1])
  attention = attention.numpy()
  for row in range(3):
    tokens = list(ids[row, 0].numpy())
    length = tokens.index(EOS_ID) + 1 if EOS_ID in tokens else np.count_nonzero(tokens)
    source_length = int(np.sum(sources[row].numpy() != 0))
    np.testing.assert_allclose(attention[row, :length].sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(attention[row, :, source_length:], 0.0)  # source padding
    np.testing.assert_array_equal(attention[row, length:], 0.0)  # after EOS
    # the batch (its padding, its longer sentences) changes neither a sentence's translation
    # nor its attention
    alone = sources[row:row + 1, :source_length]
    ids_alone, _ = decoding.decode(model, alone,
                                   DecodeConfig(beam_size=2, extra_decode_length=EXTRA))
    attention_alone = decoding.attention(model, alone, ids_alone[:, 0]).numpy()[0]
    width = ids_alone.shape[2]
    np.testing.assert_array_equal(ids_alone.numpy()[0, 0], tokens[:width])
    assert not any(tokens[width:])
    np.testing.assert_allclose(attention_alone, attention[row, :width, :source_length],
                               atol=1e-5)


def test_attention_rows_after_eos_are_zero(model_and_sources):
  model, sources = model_and_sources
  targets = tf.constant([[5, 6, EOS_ID, 0, 0], [7, EOS_ID, 0, 0, 0], [8, 9, 10, 11, EOS_ID]])
  attention = decoding.attention(model, sources, targets).numpy()
  for row, length in enumerate([3, 2, 5]):
    np.testing.assert_allclose(attention[row, :length].sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(attention[row, length:], 0.0)


# each source's 9 of the 24 ids; no PAD or BOS, as shortlist.select chooses them
SHORTLISTS = [[EOS_ID, 4, 6, 8, 10, 12, 14, 16, 18], [EOS_ID, 5, 7, 9, 11, 13, 15, 17, 19],
              [EOS_ID, 4, 5, 7, 11, 13, 17, 19, 23]]


def shortlisted_log_probs(model, source, prefix, ids):
  """`full_log_probs` normalised over the target ids `ids` alone (-inf elsewhere)."""
  logits = model((source[tf.newaxis], tf.constant([prefix])), training=False)[0, -1]
  logits = logits.numpy().astype(np.float64)
  outside = np.ones(len(logits), bool)
  outside[ids] = False
  logits[outside] = -np.inf
  return testutil.log_softmax(logits)


@pytest.mark.parametrize("beam_size", [1, 2])
def test_a_shortlist_of_the_whole_vocabulary_decodes_as_without_one(model_and_sources,
                                                                     beam_size):
  model, sources = model_and_sources
  rng = np.random.default_rng(0)
  everything = tf.constant([rng.permutation(24) for _ in range(3)], tf.int32)
  search = DecodeConfig(beam_size=beam_size, alpha=0.6, min_decode_length=2,
                        extra_decode_length=EXTRA)
  ids, scores = decoding.decode(model, sources, search)
  listed_ids, listed_scores = decoding.decode(model, sources, search, shortlist=everything)
  np.testing.assert_array_equal(listed_ids.numpy(), ids.numpy())
  np.testing.assert_allclose(listed_scores.numpy(), scores.numpy(), rtol=1e-6)


@pytest.mark.parametrize("beam_size", [1, 2])
def test_a_shortlisted_search_writes_its_ids_scored_over_them(model_and_sources, beam_size):
  model, sources = model_and_sources
  alpha = 0.6
  search = DecodeConfig(beam_size=beam_size, alpha=alpha, min_decode_length=3,
                        extra_decode_length=EXTRA)
  ids, scores = decoding.decode(model, sources, search, shortlist=tf.constant(SHORTLISTS))
  unlisted, _ = decoding.decode(model, sources, search)
  # the shortlists change things
  assert any(set(unlisted.numpy()[row].ravel()) - set(SHORTLISTS[row]) - {0} for row in range(3))
  for row, source in enumerate(sources):
    for hypothesis, score in zip(ids[row].numpy(), scores[row].numpy()):
      tokens = list(hypothesis)
      limit = np.count_nonzero(source) + EXTRA
      length = tokens.index(EOS_ID) + 1 if EOS_ID in tokens else limit
      assert set(tokens[:length]) <= set(SHORTLISTS[row]) and not any(tokens[length:])
      prefix, log_prob = [BOS_ID], 0.0
      for token in tokens[:length]:
        log_prob += shortlisted_log_probs(model, source, prefix, SHORTLISTS[row])[token]
        prefix.append(token)
      np.testing.assert_allclose(score, log_prob / float(length_penalty(length, alpha)),
                                 rtol=1e-4)


def test_xla_compiled_shortlisted_search_decodes_the_same(model_and_sources):
  model, sources = model_and_sources
  rng = np.random.default_rng(5)
  table = tf.constant(rng.integers(4, 24, size=(24, 3)), tf.int32)
  order = tf.constant(frequency_order(rng.integers(0, 100, 24)))

  def search(source_ids):
    ids = shortlist.select(table, order, source_ids, 10)
    return decoding.decode(model, source_ids, DecodeConfig(
        beam_size=2, alpha=0.6, min_decode_length=2, extra_decode_length=EXTRA),
                           shortlist=ids) + (ids,)

  ids, scores, listed = tf.function(search)(sources)
  jit_ids, jit_scores, jit_listed = tf.function(search, jit_compile=True)(sources)
  np.testing.assert_array_equal(jit_listed.numpy(), listed.numpy())
  for row in range(3):
    assert set(ids.numpy()[row].ravel()) <= set(listed.numpy()[row]) | {0}
  np.testing.assert_array_equal(jit_ids.numpy(), ids.numpy())
  np.testing.assert_allclose(jit_scores.numpy(), scores.numpy(), rtol=1e-4)


def test_a_samples_score_is_its_forced_decoding_score_and_its_draws_its_seeds(model_and_sources):
  """Sampling the real model through its key/value cache: each sample's score equals the
  forced decoding of its tokens (a full forward pass); a source's sample depends on its seed
  alone, the shortlist and prefix are kept."""
  model, sources = model_and_sources
  config = DecodeConfig(strategy="sample", alpha=0.6, sampling_temperature=1.3,
                        extra_decode_length=EXTRA)
  seeds = tf.constant([7, 8, 9], tf.int64)
  ids, scores = decoding.decode(model, sources, config, seeds=seeds)
  assert ids.shape[:2] == (3, 1)
  np.testing.assert_allclose(decoding.score(model, sources, ids[:, 0], alpha=0.6).numpy(),
                             scores.numpy()[:, 0], rtol=1e-5)
  alone, _ = decoding.decode(model, sources[1:2], config, seeds=seeds[1:2])
  width = alone.shape[2]  # the batch's widest source gives the batch more room
  np.testing.assert_array_equal(alone.numpy()[0, 0], ids.numpy()[1, 0, :width])
  others, _ = decoding.decode(model, sources, config, seeds=seeds + 100)
  assert (others.numpy() != ids.numpy()).any()
  listed = tf.constant([[EOS_ID, 5, 9, 12, 17, 20], [EOS_ID, 4, 6, 8, 10, 14],
                        [EOS_ID, 9, 11, 13, 15, 21]])
  prefix = tf.constant([[12, 5], [0, 0], [9, 0]])
  within, _ = decoding.decode(model, sources, config, prefix_ids=prefix, shortlist=listed,
                              seeds=seeds)
  for row in range(3):
    assert set(within.numpy()[row].ravel()) <= set(listed.numpy()[row]) | {0}
  assert within.numpy()[0, 0, :2].tolist() == [12, 5] and within.numpy()[2, 0, 0] == 9
