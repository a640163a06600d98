"""The repetition controls (decoding/logit_filters.py): each filter against hand-worked values
and a brute-force reference, and every strategy under them against an exhaustive or greedy
reference on a toy model whose plain output repeats one token, in the graph and under XLA."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer.config import ConfigError, DecodeConfig
from tf_transformer.decoding import lexical_constraints, logit_filters, strategies
from tf_transformer.decoding.search_ops import NEG_INF, length_penalty

PAD, EOS, START, A, B, C = 0, 1, 2, 3, 4, 5
# the same logits at every step: "a" first, so a plain search writes "a a a ..."
LOGITS = np.array([-1e9, 1.0, -1e9, 4.0, 3.0, 2.0], np.float32)
BODY = (A, B, C)


def _context(ids, step, forced=None):
  return logit_filters.StepContext(tf.constant(step), tf.constant(ids, tf.int32),
                                   tf.constant(False), forced)


def _repeats(row, step, n):
  """The tokens that would end an n-gram `row` has written in full before `step` (reference)."""
  written = list(row[:step])
  tail = tuple(written[len(written) - (n - 1):]) if n > 1 else ()
  return {written[j + n - 1] for j in range(len(written) - n + 1)
          if tuple(written[j:j + n - 1]) == tail and len(written) >= n - 1}


def test_no_repeat_ngram_masks_by_hand():
  ids = [[A, B, A, 0, 0, 0], [C, C, C, 0, 0, 0]]
  logits = tf.zeros([2, 6])
  for n, want in [(1, [{A, B}, {C}]), (2, [{B}, {C}]), (3, [set(), {C}]), (4, [set(), set()])]:
    masked = logit_filters.NoRepeatNgram(n)(logits, _context(ids, 3)).numpy()
    assert [set(np.flatnonzero(row < NEG_INF / 2)) for row in masked] == want, n


def test_no_repeat_ngram_equals_a_brute_force_reference():
  rng = np.random.default_rng(3)
  for n in (1, 2, 3):
    for step in range(0, 9):
      ids = rng.integers(3, 6, size=(4, 8))  # few tokens: many repeats
      ids[:, step:] = 0
      masked = logit_filters.NoRepeatNgram(n)(tf.zeros([4, 6]), _context(ids, step)).numpy()
      for row, want in zip(ids, masked):
        assert set(np.flatnonzero(want < NEG_INF / 2)) == _repeats(row, step, n), (n, step, row)


def test_the_repetition_penalty_divides_positive_logits_and_multiplies_negative_ones():
  logits = tf.constant([[2.0, -1.0, 0.5, 3.0, -4.0, 6.0]])
  # tokens 3 and 1 written before step 2; the 5 at position 2 is not written yet
  penalised = logit_filters.RepetitionPenalty(2.0)(logits, _context([[3, 1, 5, 0]], 2))
  np.testing.assert_allclose(penalised, [[2.0, -2.0, 0.5, 1.5, -4.0, 6.0]])
  favoured = logit_filters.RepetitionPenalty(0.5)(logits, _context([[3, 1, 5, 0]], 2))
  np.testing.assert_allclose(favoured, [[2.0, -0.5, 0.5, 6.0, -4.0, 6.0]])


def test_rows_a_prefix_forces_are_left_as_they_are():
  ids, logits = [[A, 0, 0], [A, 0, 0]], tf.fill([2, 6], 1.0)
  forced = tf.constant([True, False])
  masked = logit_filters.NoRepeatNgram(1)(logits, _context(ids, 1, forced)).numpy()
  assert masked[0, A] == 1.0 and masked[1, A] < NEG_INF / 2
  penalised = logit_filters.RepetitionPenalty(2.0)(logits, _context(ids, 1, forced)).numpy()
  assert penalised[0, A] == 1.0 and penalised[1, A] == 0.5


def _step_log_probs(written, penalty):
  """float64 log-softmax of LOGITS after `written`, penalised (reference)."""
  logits = LOGITS.astype(np.float64)
  for token in set(written):
    logits[token] = logits[token] / penalty if logits[token] > 0 else logits[token] * penalty
  return testutil.log_softmax(logits)


def _score(sequence, penalty=1.0, alpha=0.6):
  total = sum(_step_log_probs(sequence[:i], penalty)[token] for i, token in enumerate(sequence))
  return total / float(length_penalty(len(sequence), alpha))


def _allowed(sequence, n):
  return not n or all(sequence[i] not in _repeats(sequence, i, n) for i in range(len(sequence)))


def _exhaustive_best(max_length, n=0, penalty=1.0, must_contain=None):
  outputs = [body + (EOS,) for length in range(max_length)
             for body in itertools.product(BODY, repeat=length)]
  outputs = [o for o in outputs if _allowed(o, n) and (must_contain is None or must_contain in o)]
  return max(outputs, key=lambda o: _score(o, penalty))


def _greedy(max_length, n=0, penalty=1.0, prefix=()):
  """Argmax decoding under the controls, a forced prefix written as given (reference)."""
  sequence = list(prefix)
  while len(sequence) < max_length and (not sequence or sequence[-1] != EOS):
    log_probs = _step_log_probs(sequence, penalty)
    log_probs[list(_repeats(sequence, len(sequence), n)) if n else []] = -np.inf
    sequence.append(int(np.argmax(log_probs)))
  return tuple(sequence)


def _search(config, max_length, prefix=None, constraints=None, jit=False):
  def toy(ids, step, cache):
    return tf.tile(LOGITS[tf.newaxis], [tf.shape(ids)[0], 1]), cache

  strategy = strategies.from_config(config, constrained=constraints is not None)

  def run():
    return strategy(toy, tf.fill([1], START), {"unused": tf.zeros([1])},
                    max_decode_length=max_length, eos_id=EOS, min_decode_length=0,
                    buffer_length=max_length, prefix_ids=prefix,
                    seeds=tf.constant([7], tf.int64), constraints=constraints)

  ids, scores = tf.function(run, jit_compile=jit)() if jit else run()
  row = list(ids.numpy()[0, 0])
  return tuple(row[:row.index(EOS) + 1] if EOS in row else row), float(scores[0, 0])


@pytest.mark.parametrize("jit", [False, True])
def test_temperature_zero_follows_the_argmax_reference(jit):
  plain = _greedy(6)
  assert plain == (A,) * 6  # the model's own output repeats
  assert _search(DecodeConfig(strategy="sample", sampling_temperature=0.0), 6)[0] == plain
  for n, penalty in [(1, 1.0), (2, 1.0), (3, 1.0), (0, 3.0), (2, 1.5)]:
    want = _greedy(6, n, penalty)
    assert want != plain
    config = DecodeConfig(strategy="sample", sampling_temperature=0.0, no_repeat_ngram_size=n,
                          repetition_penalty=penalty)
    assert _search(config, 6, jit=jit)[0] == want, (n, penalty)
  assert _greedy(6, 2) == (A, A, B, A, C, A)  # by hand
  assert _greedy(6, 1) == (A, B, C, EOS)


@pytest.mark.parametrize("n, penalty", [(1, 1.0), (2, 1.0), (0, 2.0), (2, 2.0)])
def test_a_wide_beam_finds_the_exhaustive_best_under_the_controls(n, penalty):
  want = _exhaustive_best(5, n, penalty)
  config = DecodeConfig(beam_size=27, alpha=0.6, no_repeat_ngram_size=n,
                        repetition_penalty=penalty)
  got, score = _search(config, 5)
  assert got == want
  np.testing.assert_allclose(score, _score(want, penalty), rtol=1e-5)


def test_constrained_search_meets_its_phrase_under_the_controls():
  constraints = lexical_constraints.from_phrases(
      tf.ragged.constant([[[C]]], tf.int32), tf.ragged.constant([[]], tf.int32, ragged_rank=2))
  want = _exhaustive_best(5, 1, must_contain=C)
  config = DecodeConfig(beam_size=27, alpha=0.6, no_repeat_ngram_size=1)
  for jit in (False, True):
    assert _search(config, 5, constraints=constraints, jit=jit)[0] == want


def test_a_forced_prefix_is_written_as_given_and_the_controls_follow_it():
  prefix = tf.constant([[A, A]], tf.int32)
  config = DecodeConfig(strategy="sample", sampling_temperature=0.0, no_repeat_ngram_size=1)
  assert _search(config, 6, prefix=prefix)[0] == _greedy(6, 1, prefix=(A, A)) == (
      A, A, B, C, EOS)
  # a beam search's best continuation after the prefix, among those that repeat nothing more
  outputs = [(A, A) + body + (EOS,) for length in range(4)
             for body in itertools.permutations((B, C), length) if len(body) == length]
  want = max(outputs, key=_score)
  assert _search(DecodeConfig(beam_size=8, no_repeat_ngram_size=1), 6, prefix=prefix)[0] == want


def test_sampling_draws_no_repeat_and_scores_the_penalised_distribution():
  config = DecodeConfig(strategy="sample", sampling_temperature=1.0, no_repeat_ngram_size=1,
                        repetition_penalty=2.0)
  for jit in (False, True):
    sequence, score = _search(config, 5, jit=jit)
    assert len(set(sequence)) == len(sequence)
    np.testing.assert_allclose(score, _score(sequence, 2.0), rtol=1e-5)


@pytest.mark.parametrize("field, value", [("no_repeat_ngram_size", -1),
                                          ("repetition_penalty", 0.0),
                                          ("repetition_penalty", float("inf"))])
def test_out_of_range_settings_are_refused_naming_the_field(field, value):
  with pytest.raises(ConfigError, match=field):
    DecodeConfig(**{field: value})
