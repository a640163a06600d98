"""decoding/strategies.py: each config gives the search it names; beam_size 1 is argmax greedy
(not a beam of one), checked on a hand-worked chain where the two differ."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import DecodeConfig
from tf_transformer.decoding import beam_search, logit_filters, strategies

EOS, A, B, C = 1, 2, 3, 4
V = 5


def _probabilities() -> np.ndarray:
  """[V, V]: row t, the next token's probabilities after token t (0: the start)."""
  table = np.full([V, V], 0.9 / (V - 2))
  table[:, EOS] = 0.1
  table[:, 0] = 0.0
  table[0] = [0, 0.45, 0.55, 0, 0]  # the start: A (0.55) over EOS (0.45)
  table[A] = [0, 0.05, 0, 0.5, 0.45]  # after A: B (0.5), C (0.45), EOS (0.05)
  table[B] = [0, 0.9, 0.05, 0, 0.05]  # after B: EOS
  return table


LOG_PROBS = np.log(np.maximum(_probabilities(), 1e-30)).astype(np.float32)


def _chain(ids, step, cache):
  """The next token's log-probabilities after `ids` [B]: the table's rows."""
  return tf.gather(tf.constant(LOG_PROBS), ids), cache


def _search(strategy, seeds=None):
  return strategy(_chain, tf.zeros([1], tf.int32), {}, max_decode_length=6, eos_id=EOS,
                  min_decode_length=0, buffer_length=6,
                  seeds=tf.constant([7], tf.int64) if seeds is None else seeds)


def test_beam_size_one_is_the_argmax_at_each_step_not_a_beam_of_one():
  """Argmax: A (0.55), then B (0.5), then EOS (0.9), log-probability log(0.2475). A beam of
  one also keeps the start's second-best extension, EOS (0.45), which outscores A B EOS."""
  greedy = strategies.from_config(DecodeConfig(beam_size=1, alpha=0.0))
  assert isinstance(greedy, strategies.GreedySearch)
  ids, scores = _search(greedy)
  assert ids.numpy().tolist() == [[[A, B, EOS, 0, 0, 0]]]
  np.testing.assert_allclose(scores.numpy(), [[np.log(0.55 * 0.5 * 0.9)]], rtol=1e-6)
  beam_ids, beam_scores = beam_search.beam_search(_chain, tf.zeros([1], tf.int32), {}, 1, 0.0,
                                                  6, EOS, buffer_length=6)
  assert beam_ids.numpy().tolist() == [[[EOS, 0, 0, 0, 0, 0]]]
  np.testing.assert_allclose(beam_scores.numpy(), [[np.log(0.45)]], rtol=1e-6)


def test_greedy_writes_what_sampling_at_temperature_zero_writes_whatever_the_seed():
  greedy_ids, greedy_scores = _search(strategies.from_config(DecodeConfig(beam_size=1)))
  for seed in (0, 5, 2**40):
    ids, scores = _search(strategies.from_config(DecodeConfig(
        strategy="sample", sampling_temperature=0.0, sampling_topk=3)),
                          seeds=tf.constant([seed], tf.int64))
    np.testing.assert_array_equal(ids.numpy(), greedy_ids.numpy())
    np.testing.assert_array_equal(scores.numpy(), greedy_scores.numpy())


@pytest.mark.parametrize("config, want", [
    (DecodeConfig(beam_size=4, alpha=0.8, no_repeat_ngram_size=2),
     strategies.BeamSearch(4, 0.8, logit_filters.RepetitionControls(2, 1.0))),
    (DecodeConfig(beam_size=1, alpha=0.7, repetition_penalty=1.5),
     strategies.GreedySearch(0.7, logit_filters.RepetitionControls(0, 1.5))),
    (DecodeConfig(strategy="sample", sampling_topk=7, sampling_topp=0.8,
                  sampling_temperature=0.6, alpha=0.2, no_repeat_ngram_size=3),
     strategies.RandomSampling(7, 0.8, 0.6, 0.2, logit_filters.RepetitionControls(3, 1.0))),
])
def test_each_config_gives_its_search_with_every_setting(config, want):
  assert strategies.from_config(config) == want


def test_constraints_take_the_constrained_beam_even_at_beam_size_one():
  """A constrained search needs its banks of hypotheses; width 1 is one bank a kind."""
  search = strategies.from_config(DecodeConfig(beam_size=1), constrained=True)
  assert search == strategies.ConstrainedBeamSearch(1, 0.6, logit_filters.RepetitionControls())
