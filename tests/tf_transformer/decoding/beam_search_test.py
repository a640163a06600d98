"""Beam search against exhaustive search and a greedy reference on a toy model with a cache."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer.decoding.beam_search import beam_search
from tf_transformer.decoding.search_ops import length_penalty, top_k_rows

EOS, START, VOCAB, MAX_LENGTH = 1, 2, 5, 4
TABLE = np.random.default_rng(0).normal(size=(MAX_LENGTH, VOCAB, VOCAB, VOCAB)).astype("float32")
TABLE[..., 0] = -1e9  # token 0 (padding) is never produced


def toy_logits(ids, step, cache):
  """Logits from (step, last token, running token sum mod V): the cache carries the sum."""
  total = cache["sum"] % VOCAB
  logits = tf.gather_nd(TABLE, tf.stack([tf.fill(tf.shape(ids), step), ids, total], axis=1))
  return logits, {"sum": cache["sum"] + ids}


def sequence_log_prob(sequence):
  """Log-probability of `sequence` (tokens after START) under the toy model, in float64."""
  last, total, log_prob = START, 0, 0.0
  for step, token in enumerate(sequence):
    logits = TABLE[step, last, total % VOCAB].astype(np.float64)
    log_prob += testutil.log_softmax(logits)[token]
    total += last
    last = token
  return log_prob


def run(beam_size, alpha=0.6, batch=1, min_decode_length=0, max_length=MAX_LENGTH, prefix_ids=None):
  initial = tf.fill([batch], START)
  ids, scores = beam_search(toy_logits, initial, {"sum": tf.zeros([batch], tf.int32)},
                            beam_size, alpha, max_length, EOS, min_decode_length,
                            prefix_ids=prefix_ids)
  return ids.numpy(), scores.numpy()


def finished_sequences(max_length):
  for length in range(1, max_length + 1):
    for body in itertools.product(range(2, VOCAB), repeat=length - 1):
      yield body + (EOS,)


def test_length_penalty_equals_hand_computed_gnmt_values():
  """((5 + length) / 6) ** alpha by hand: 1 at length 1, 2 ** alpha at length 7 and
  3 ** alpha at length 13; 1 at any length with alpha 0."""
  np.testing.assert_allclose(length_penalty(tf.constant([1, 7, 13]), 0.6),
                             [1.0, 1.5157165665103980, 1.9331820449317627], rtol=1e-6)
  np.testing.assert_allclose(length_penalty(tf.constant([1, 7, 13]), 1.0), [1.0, 2.0, 3.0],
                             rtol=1e-6)
  np.testing.assert_array_equal(length_penalty(tf.constant([1, 40]), 0.0), [1.0, 1.0])


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_wide_beam_equals_exhaustive_search(alpha):
  exhaustive = sorted(
      (sequence_log_prob(s) / float(length_penalty(len(s), alpha)), s)
      for s in finished_sequences(MAX_LENGTH))[::-1]
  ids, scores = run(beam_size=27, alpha=alpha)  # >= the 3^3 live prefixes: nothing is pruned
  for rank in range(5):
    want_score, want_sequence = exhaustive[rank]
    np.testing.assert_allclose(scores[0, rank], want_score, rtol=1e-5)
    assert tuple(ids[0, rank, :len(want_sequence)]) == want_sequence
    assert not ids[0, rank, len(want_sequence):].any()


def test_scores_equal_the_forced_decode_score_of_each_hypothesis():
  ids, scores = run(beam_size=4, alpha=0.6)
  for sequence, score in zip(ids[0], scores[0]):
    tokens = tuple(sequence[:list(sequence).index(EOS) + 1])
    want = sequence_log_prob(tokens) / float(length_penalty(len(tokens), 0.6))
    np.testing.assert_allclose(score, want, rtol=1e-5)


def test_nbest_is_sorted_and_distinct():
  ids, scores = run(beam_size=4, batch=3)
  assert (np.diff(scores, axis=1) <= 0).all()
  for row in ids:
    assert len({tuple(sequence) for sequence in row}) == len(row)


def test_beam_one_equals_greedy():
  ids, _ = run(beam_size=1, alpha=0.0)
  last, total, greedy = START, 0, []
  for step in range(MAX_LENGTH):
    token = int(np.argmax(TABLE[step, last, total % VOCAB]))
    greedy.append(token)
    if token == EOS:
      break
    total += last
    last = token
  assert list(ids[0, 0, :len(greedy)]) == greedy


def test_min_length_suppresses_eos():
  ids, _ = run(beam_size=3, min_decode_length=MAX_LENGTH)
  for sequence in ids[0]:
    assert EOS not in sequence[:MAX_LENGTH - 1]


def test_best_beam_score_is_at_least_greedy():
  _, greedy_scores = run(beam_size=1, batch=2)
  _, beam_scores = run(beam_size=4, batch=2)
  assert (beam_scores[:, 0] >= greedy_scores[:, 0] - 1e-6).all()


def test_static_shapes_compile_in_a_function():
  """A batch with a static shape keeps it through the loop (as XLA and fixed signatures need)."""
  search = tf.function(lambda initial: beam_search(
      toy_logits, initial, {"sum": tf.zeros([3], tf.int32)}, 2, 0.6, MAX_LENGTH, EOS))
  ids, scores = search(tf.fill([3], START))
  assert ids.shape == (3, 2, MAX_LENGTH) and scores.shape == (3, 2)
  np.testing.assert_array_equal(ids.numpy(), run(beam_size=2, batch=3)[0])


@pytest.mark.parametrize("vocab_size, k", [(8000, 8), (8000, 2), (1000, 16), (130, 3), (100, 2)])
def test_top_k_by_chunk_maxima_equals_top_k(vocab_size, k):
  x = tf.constant(np.random.default_rng(vocab_size + k).permutation(12 * vocab_size)
                  .reshape(12, vocab_size).astype(np.float32))  # distinct values: no ties
  # the largest values of some rows crowded into one chunk
  x = tf.tensor_scatter_nd_update(x, [[0, i] for i in range(k)], [1e6 + i for i in range(k)])
  values, indices = top_k_rows(x, k)
  want_values, want_indices = tf.math.top_k(x, k=k)
  np.testing.assert_array_equal(values.numpy(), want_values.numpy())
  np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())


def test_top_k_rows_without_a_static_vocabulary_size():
  x = np.random.default_rng(5).permutation(2 * 500).reshape(2, 500).astype(np.float32)
  top_k = tf.function(lambda x: top_k_rows(x, 4),
                      input_signature=[tf.TensorSpec([None, None], tf.float32)])
  values, indices = top_k(tf.constant(x))
  want_values, want_indices = tf.math.top_k(x, k=4)
  np.testing.assert_array_equal(values.numpy(), want_values.numpy())
  np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())


@pytest.mark.parametrize("beam_size", [1, 3])
def test_each_sentence_stops_at_its_own_limit_as_if_decoded_alone(beam_size):
  # the toy model's sentences are all alike, so sentence b alone with limit l_b is the
  # reference for row b of a batch with limits [2, 4, 3]
  limits = [2, 4, 3]
  initial = tf.fill([3], START)
  ids, scores = beam_search(toy_logits, initial, {"sum": tf.zeros([3], tf.int32)}, beam_size,
                            0.6, tf.constant(limits), EOS, buffer_length=MAX_LENGTH)
  for row, limit in enumerate(limits):
    alone_ids, alone_scores = run(beam_size=beam_size, max_length=limit)
    np.testing.assert_array_equal(ids[row, :, :limit].numpy(), alone_ids[0])
    assert not ids[row, :, limit:].numpy().any()
    np.testing.assert_allclose(scores[row].numpy(), alone_scores[0], rtol=1e-6)


# (prefix, rows): sentences with prefixes of 0, 1 and 2 tokens in one batch, 0-padded
PREFIXES = [(), (4,), (3, 2)]
PREFIX_IDS = tf.constant([[0, 0], [4, 0], [3, 2]], tf.int32)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_forced_prefix_continues_as_the_exhaustive_search_over_its_continuations(alpha):
  ids, scores = run(beam_size=27, alpha=alpha, batch=3, prefix_ids=PREFIX_IDS)
  for row, prefix in enumerate(PREFIXES):
    exhaustive = sorted(
        (sequence_log_prob(s) / float(length_penalty(len(s), alpha)), s)
        for s in finished_sequences(MAX_LENGTH) if s[:len(prefix)] == prefix)[::-1]
    for rank in range(3):
      want_score, want_sequence = exhaustive[rank]
      np.testing.assert_allclose(scores[row, rank], want_score, rtol=1e-5)
      assert tuple(ids[row, rank, :len(want_sequence)]) == want_sequence


# alpha 5: the length penalty of these short prefixes is as large as alpha 0.6 gives a prefix of
# 20 tokens, where a masked-out candidate ending in EOS would score above -1e9 / 2 and pass for
# a finished hypothesis
@pytest.mark.parametrize("alpha", [0.6, 5.0])
def test_every_hypothesis_starts_with_its_prefix_and_scores_as_forced_decoding(alpha):
  ids, scores = run(beam_size=4, alpha=alpha, batch=3, prefix_ids=PREFIX_IDS)
  for row, prefix in enumerate(PREFIXES):
    for sequence, score in zip(ids[row], scores[row]):
      assert tuple(sequence[:len(prefix)]) == prefix
      # a live hypothesis (no EOS) completes the n-best, scored at the length limit
      tokens = tuple(sequence[:list(sequence).index(EOS) + 1] if EOS in sequence else sequence)
      want = sequence_log_prob(tokens) / float(length_penalty(len(tokens), alpha))
      np.testing.assert_allclose(score, want, rtol=1e-5)


def test_empty_prefixes_change_nothing():
  for prefix_ids in (tf.zeros([2, 3], tf.int32), tf.zeros([2, 0], tf.int32)):
    for got, want in zip(run(beam_size=3, batch=2, prefix_ids=prefix_ids),
                         run(beam_size=3, batch=2)):
      np.testing.assert_array_equal(got, want)
