"""Random sampling against independent references: draws against the distribution they come
from (a chi-square bound), the nucleus against hand-worked sets, temperature 0 against a greedy
loop in NumPy, and a row's draws against its seed alone."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import DecodeConfig
from tf_transformer.decoding import lexical_constraints, sampling, strategies

EOS = 1
LOGITS = np.array([2.0, -0.5, 1.0, 0.5, 0.0, -1.0, 1.5, -2.0])  # one step's, V = 8
# chi-square quantiles at 1 - 1e-4, by degrees of freedom (a true distribution fails 1 in 10^4)
CHI2_LIMIT = {1: 15.14, 2: 18.42, 3: 21.11, 4: 23.51, 5: 25.74, 6: 27.86, 7: 29.88}
DRAWS = 20_000


def _constant_logits(ids, step, cache):
  """Every row, every step: LOGITS."""
  return tf.tile(tf.constant(LOGITS, tf.float32)[tf.newaxis], [tf.shape(ids)[0], 1]), cache


def _first_tokens(top_k=0, top_p=1.0, temperature=1.0, seed_offset=0) -> np.ndarray:
  """The first token of DRAWS samples, one row each, seeds seed_offset + 0, 1, ..."""
  seeds = tf.range(DRAWS, dtype=tf.int64) + seed_offset
  ids, _ = sampling.sample(_constant_logits, tf.zeros([DRAWS], tf.int32), {}, seeds, 1, EOS,
                           top_k=top_k, top_p=top_p, temperature=temperature)
  return ids.numpy()[:, 0, 0]


def _expected(top_k, temperature, allowed=None) -> np.ndarray:
  """float64 [V]: softmax(LOGITS / temperature) restricted to the top_k (0: all) or to the
  `allowed` ids, renormalised."""
  keep = np.zeros(len(LOGITS), bool)
  if allowed is not None:
    keep[list(allowed)] = True
  else:
    keep[np.argsort(-LOGITS)[:top_k or len(LOGITS)]] = True
  weights = np.where(keep, np.exp(LOGITS / temperature - np.max(LOGITS / temperature)), 0.0)
  return weights / weights.sum()


def _chi_square(tokens, expected) -> tuple[float, int]:
  """(Pearson's statistic, degrees of freedom) of the draws against `expected`, over the ids it
  gives a probability; no draw may fall outside them."""
  counts = np.bincount(tokens, minlength=len(expected))
  support = expected > 0
  assert counts[~support].sum() == 0, counts
  want = expected[support] * len(tokens)
  return float(((counts[support] - want) ** 2 / want).sum()), int(support.sum()) - 1


@pytest.mark.parametrize("top_k,temperature", [(0, 1.0), (3, 1.0), (5, 0.6), (0, 2.5), (8, 1.0)])
def test_draws_follow_softmax_over_temperature_restricted_to_the_top_k(top_k, temperature):
  statistic, freedom = _chi_square(_first_tokens(top_k, temperature=temperature),
                                   _expected(top_k, temperature))
  assert statistic < CHI2_LIMIT[freedom], (statistic, freedom)


def test_the_chi_square_bound_rejects_a_wrong_distribution():
  """The bound has power: draws at temperature 1 fail against the distribution at 1.2."""
  statistic, freedom = _chi_square(_first_tokens(), _expected(0, 1.2))
  assert statistic > CHI2_LIMIT[freedom]


# probabilities 0.5, 0.2, 0.15, 0.1, 0.05 (ids 3, 0, 4, 1, 2 in order)
NUCLEUS_PROBS = np.array([0.2, 0.1, 0.05, 0.5, 0.15])


@pytest.mark.parametrize("top_p,want", [
    (0.5, {3}),  # 0.5 reaches 0.5
    (0.6, {3, 0}),  # 0.5 < 0.6 <= 0.7
    (0.7, {3, 0}),
    (0.71, {3, 0, 4}),  # 0.7 < 0.71 <= 0.85
    (0.86, {3, 0, 4, 1}),  # 0.85 < 0.86 <= 0.95
    (0.96, {3, 0, 4, 1, 2}),
    (1.0, {3, 0, 4, 1, 2}),
    (0.01, {3}),  # the most probable is always kept
])
def test_the_nucleus_is_the_smallest_set_whose_probability_reaches_p(top_p, want):
  logits = tf.constant(np.log(NUCLEUS_PROBS)[np.newaxis], tf.float32)
  values, ids = sampling.candidates(logits, top_k=0, top_p=top_p)
  ids = np.broadcast_to(ids.numpy(), values.shape)  # ([V] with no filter: every row's)
  kept = {int(i) for i, v in zip(ids[0], values.numpy()[0]) if v > -1e8}
  assert kept == want


def test_nucleus_draws_stay_in_the_nucleus_with_its_renormalised_probabilities():
  # LOGITS' probabilities in order: ids 0 (.403), 6 (.244), 2 (.148), 3 (.090), ...: p = 0.75
  # keeps 0, 6 and 2 (0.647 < 0.75 <= 0.795)
  statistic, freedom = _chi_square(_first_tokens(top_p=0.75), _expected(0, 1.0, {0, 6, 2}))
  assert freedom == 2 and statistic < CHI2_LIMIT[freedom]


def test_top_k_then_top_p():
  """The nucleus is taken of the top-k distribution, renormalised: k = 2 keeps 0 (.62) and 6
  (.38) of it, p = 0.6 then keeps 0 alone."""
  assert set(_first_tokens(top_k=2, top_p=0.6)) == {0}
  assert set(_first_tokens(top_k=2, top_p=0.7)) == {0, 6}


TABLE = np.random.default_rng(3).normal(size=(8, 8)) * 2.0  # logits of the next token by last


def _markov(ids, step, cache):
  """A toy model: the next token's logits are TABLE's row of the last token; the cache counts
  the steps (so a search must carry it)."""
  return tf.gather(tf.constant(TABLE, tf.float32), ids), {"steps": cache["steps"] + 1}


def _greedy(start: int, length: int) -> list[int]:
  """The argmax path of TABLE from `start`, stopped after EOS or at `length` tokens."""
  out, last = [], start
  while len(out) < length:
    last = int(np.argmax(TABLE[last]))
    out.append(last)
    if last == EOS:
      break
  return out + [0] * (length - len(out))


@pytest.mark.parametrize("temperature", [0.0, 1e-4])
def test_temperature_towards_zero_gives_the_greedy_output(temperature):
  starts = tf.constant([0, 2, 3, 4, 5, 6, 7], tf.int32)
  cache = {"steps": tf.zeros([7], tf.int32)}
  ids, _ = sampling.sample(_markov, starts, cache, tf.range(7, dtype=tf.int64), 12, EOS,
                           temperature=temperature)
  assert ids.numpy()[:, 0].tolist() == [_greedy(start, 12) for start in starts.numpy()]


def _markov_samples(seeds, starts, **settings):
  cache = {"steps": tf.zeros_like(starts)}
  return sampling.sample(_markov, starts, cache, tf.cast(seeds, tf.int64), 10, EOS,
                         **settings)


def test_a_rows_draws_depend_on_its_seed_alone():
  """The same seed and start give the same sample at any row of any batch; other seeds give
  other samples."""
  seeds = [11, 12, 13, 14, 15, 16]
  ids, scores = _markov_samples(seeds, tf.constant([4] * 6))
  alone, alone_scores = _markov_samples([13], tf.constant([4]))
  np.testing.assert_array_equal(ids.numpy()[2], alone.numpy()[0])
  np.testing.assert_array_equal(scores.numpy()[2], alone_scores.numpy()[0])
  shuffled, _ = _markov_samples([16, 13, 2**40 + 5, -7], tf.constant([4, 4, 4, 4]))
  np.testing.assert_array_equal(shuffled.numpy()[1], ids.numpy()[2])
  np.testing.assert_array_equal(shuffled.numpy()[0], ids.numpy()[5])
  assert len({tuple(row) for row in ids.numpy()[:, 0]}) >= 4  # six seeds, not one sample


def test_xla_draws_what_the_graph_draws():
  starts = tf.constant([0, 2, 3, 4, 5, 6, 7, 4])
  seeds = tf.constant([1, 2, 3, 4, 5, 6, 7, 8], tf.int64)

  def search(seeds):
    return _markov_samples(seeds, starts, top_k=4, top_p=0.9, temperature=0.8, alpha=0.6)

  ids, scores = tf.function(search)(seeds)
  jit_ids, jit_scores = tf.function(search, jit_compile=True)(seeds)
  np.testing.assert_array_equal(jit_ids.numpy(), ids.numpy())
  np.testing.assert_allclose(jit_scores.numpy(), scores.numpy(), rtol=1e-5)


def test_scores_are_the_models_log_probability_over_the_length_penalty():
  """At any temperature and filter, a sample's score is its log-probability under the model's
  whole distribution (temperature 1), summed by hand, over ((5 + length) / 6)^alpha."""
  starts = tf.constant([0, 2, 3, 4, 5, 6])
  ids, scores = _markov_samples(list(range(6)), starts, top_k=3, temperature=1.7, alpha=0.6)
  log_probs = TABLE - np.log(np.exp(TABLE).sum(axis=1, keepdims=True))
  for row, start in enumerate(starts.numpy()):
    tokens = ids.numpy()[row, 0]
    length = int(np.argmax(tokens == EOS)) + 1 if EOS in tokens else len(tokens)
    path = [start] + list(tokens[:length])
    total = sum(log_probs[a, b] for a, b in zip(path, path[1:]))
    np.testing.assert_allclose(scores.numpy()[row, 0], total / ((5 + length) / 6) ** 0.6,
                               rtol=1e-5)


def test_no_eos_before_the_minimum_length_and_nothing_after_it():
  """min_decode_length 4: EOS is the 4th token at the earliest, and some rows end right there
  (an off-by-one either way fails)."""
  starts = tf.constant([0, 2, 3, 4, 5, 6] * 20)
  ids, _ = _markov_samples(list(range(120)), starts, min_decode_length=4)
  first_ends = []
  for row in ids.numpy()[:, 0]:
    ends = np.flatnonzero(row == EOS)
    if len(ends):
      assert not row[ends[0] + 1:].any(), row
      first_ends.append(int(ends[0]))
  assert min(first_ends) == 3, sorted(first_ends)


def _log_probability(start, tokens) -> float:
  """log P(tokens | start) under TABLE (temperature 1), up to its first EOS."""
  log_probs = TABLE - np.log(np.exp(TABLE).sum(axis=1, keepdims=True))
  tokens = list(tokens)
  tokens = tokens[:tokens.index(EOS) + 1] if EOS in tokens else tokens
  path = [start] + tokens
  return sum(log_probs[a, b] for a, b in zip(path, path[1:])), len(tokens)


def test_a_forced_prefix_is_written_first_and_scored():
  """The forced tokens are the output's first and count in its score as drawn ones do (the
  model's log-probability of the whole output, the prefix's pieces included)."""
  starts = tf.constant([0, 0, 3])
  prefix = tf.constant([[5, 6, 7], [0, 0, 0], [2, 0, 0]])
  cache = {"steps": tf.zeros([3], tf.int32)}
  ids, scores = sampling.sample(_markov, starts, cache, tf.constant([1, 2, 3], tf.int64), 10,
                                EOS, prefix_ids=prefix, alpha=0.6)
  assert ids.numpy()[0, 0, :3].tolist() == [5, 6, 7] and ids.numpy()[2, 0, 0] == 2
  for row, start in enumerate(starts.numpy()):
    total, length = _log_probability(start, ids.numpy()[row, 0])
    np.testing.assert_allclose(scores.numpy()[row, 0], total / ((5 + length) / 6) ** 0.6,
                               rtol=1e-5)


def test_each_step_draws_anew():
  """Ten steps of one row are ten independent draws: over all steps and rows the tokens follow
  the distribution, and no row repeats one token throughout (chance: sum of p^10, < 1e-3)."""
  rows = DRAWS // 10
  ids, _ = sampling.sample(_constant_logits, tf.zeros([rows], tf.int32), {},
                           tf.range(rows, dtype=tf.int64), 10, EOS, top_k=4)
  tokens = ids.numpy()[:, 0]  # [rows, 10]: EOS (id 1) is outside the top 4, so no row ends
  statistic, freedom = _chi_square(tokens.ravel(), _expected(4, 1.0))
  assert statistic < CHI2_LIMIT[freedom], (statistic, freedom)
  assert (tokens == tokens[:, :1]).all(axis=1).mean() < 0.01


def test_a_smaller_top_k_or_top_p_only_removes_candidates():
  """The noise belongs to a token, not to its rank: with the same seeds, a draw that the
  whole distribution makes among its top 3 is also the top-3 draw, and a top-p draw too."""
  whole = _first_tokens()
  for narrower in (_first_tokens(top_k=3), _first_tokens(top_p=0.75)):
    kept = np.isin(whole, [0, 6, 2])  # the top 3 (and p = 0.75's nucleus)
    np.testing.assert_array_equal(narrower[kept], whole[kept])


def test_the_sampling_strategy_refuses_lexical_constraints():
  """Constraints are a beam search's (it keeps hypotheses by the terms they met); a sample
  under them is refused, not drawn without them: in from_config, and by the strategy itself."""
  with pytest.raises(strategies.ConstraintsNeedBeamError) as error:
    strategies.from_config(DecodeConfig(strategy="sample"), constrained=True)
  assert str(error.value) == "lexical constraints need a beam search, not strategy=sample"
  assert error.value.as_flags() == "lexical constraints need a beam search, not --strategy=sample"
  strategy = strategies.RandomSampling(top_k=0, top_p=1.0, temperature=1.0, alpha=0.0)
  constraints = lexical_constraints.Constraints(tf.constant([[3]]), tf.constant([[False]]),
                                                tf.zeros([1, 0, 0], tf.int32))
  with pytest.raises(strategies.ConstraintsNeedBeamError):
    strategy(_constant_logits, tf.zeros([1], tf.int32), {}, max_decode_length=3, eos_id=EOS,
             min_decode_length=0, buffer_length=3, seeds=tf.constant([1], tf.int64),
             constraints=constraints)
