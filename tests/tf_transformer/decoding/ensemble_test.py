"""Ensembles in decoding against independent references: a model ensembled with itself is the
model; two members' scores are the weighted mean of their forced-decoding log-probabilities,
worked out in float64 from full forward passes; the beam result is an exhaustive search's."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_pipeline.token_ids import BOS_ID, EOS_ID, PAD_ID
from tests import testutil
from tf_transformer import decoding
from tf_transformer.decoding.search_ops import length_penalty
from tf_transformer.config import DecodeConfig
from tf_transformer.decoding.ensemble import Ensemble
from tf_transformer.model import Transformer

SOURCES = tf.constant([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, 0, 0], [11, EOS_ID, 0, 0, 0]])


def _model(seed, vocab_size=24, **sizes):
  keras.utils.set_random_seed(seed)
  model = Transformer(vocab_size, vocab_size, **{**dict(num_layers=2, d_model=32, num_heads=4,
                                                         d_ff=64), **sizes})
  model((SOURCES[:, :2] % vocab_size, tf.fill([3, 2], BOS_ID)))  # builds it
  return model


@pytest.fixture(scope="module")
def pair():
  """Two models of different sizes over the same vocabulary."""
  return _model(3), _model(4, num_layers=1, d_model=16, num_heads=2, d_ff=32)


def _hand_log_probs(model, source, target) -> float:
  """float64: sum over `target` (EOS-terminated, unpadded) of log p(token | prefix, source) from
  one full forward pass, PAD and BOS left out of the distribution."""
  logits = model((tf.constant([source]), tf.constant([[BOS_ID] + target[:-1]])),
                 training=False)[0].numpy().astype(np.float64)
  logits[:, [PAD_ID, BOS_ID]] = -np.inf
  log_probs = np.stack([testutil.log_softmax(row) for row in logits])
  return float(sum(log_probs[i, token] for i, token in enumerate(target)))


@pytest.mark.parametrize("search", [
    DecodeConfig(beam_size=3, alpha=0.6, extra_decode_length=5),
    DecodeConfig(beam_size=1, extra_decode_length=5),
    DecodeConfig(strategy="sample", sampling_topk=5, extra_decode_length=5)])
def test_a_model_ensembled_with_itself_decodes_and_scores_as_the_model(pair, search):
  model = pair[0]
  itself = Ensemble((model, model))
  prefix = tf.constant([[12, 5], [0, 0], [9, 0]])
  shortlist = tf.constant([[EOS_ID, 5, 9, 12, 17, 20, 21, 22], [EOS_ID, 4, 6, 8, 10, 14, 16, 18],
                           [EOS_ID, 9, 11, 13, 15, 19, 21, 23]])
  for extra in ({}, {"prefix_ids": prefix, "shortlist": shortlist}):
    ids, scores = decoding.decode(model, SOURCES, search, **extra)
    ensemble_ids, ensemble_scores = decoding.decode(itself, SOURCES, search, **extra)
    np.testing.assert_array_equal(ensemble_ids.numpy(), ids.numpy())
    np.testing.assert_allclose(ensemble_scores.numpy(), scores.numpy(), rtol=1e-6)
  best = ids[:, 0]
  np.testing.assert_allclose(decoding.score(itself, SOURCES, best, 0.6).numpy(),
                             decoding.score(model, SOURCES, best, 0.6).numpy(), rtol=1e-6)
  np.testing.assert_allclose(decoding.attention(itself, SOURCES, best).numpy(),
                             decoding.attention(model, SOURCES, best).numpy(), atol=1e-6)


def test_two_members_score_the_weighted_mean_of_their_log_probabilities(pair):
  """score(ensemble) = 0.7 log p1 + 0.3 log p2 of each target, by hand in float64; the search's
  scores (beam and sampling) are the ensemble's score of what it wrote."""
  first, second = pair
  ensemble = Ensemble(pair, weights=(7, 3))
  assert ensemble.weights == pytest.approx((0.7, 0.3))
  targets = [[5, 9, EOS_ID], [12, EOS_ID], [20, 21, 22, 23, EOS_ID]]
  padded = tf.constant([row + [0] * (5 - len(row)) for row in targets])
  got = decoding.score(ensemble, SOURCES, padded).numpy()
  for row, target in enumerate(targets):
    source = [token for token in SOURCES[row].numpy() if token]
    want = (0.7 * _hand_log_probs(first, source, target)
            + 0.3 * _hand_log_probs(second, source, target))
    assert got[row] == pytest.approx(want, rel=1e-5)
  for search in (DecodeConfig(beam_size=3, alpha=0.6, extra_decode_length=4),
                 DecodeConfig(strategy="sample", alpha=0.6, extra_decode_length=4)):
    ids, scores = decoding.decode(ensemble, SOURCES, search)
    # (a hypothesis at the limit, without </s>, is scored as the tokens it has)
    rescored = decoding.score(ensemble, SOURCES, ids[:, 0], alpha=0.6).numpy()
    np.testing.assert_allclose(rescored, scores.numpy()[:, 0], rtol=1e-5)


def test_the_attention_of_two_members_is_their_weighted_mean(pair):
  """Each member's cross-attention weighed as its log-probabilities are (0.7, 0.3), not the
  first member's alone; a row still sums to 1 over the source."""
  ensemble = Ensemble(pair, weights=(7, 3))
  targets = tf.constant([[5, 9, EOS_ID, 0], [12, EOS_ID, 0, 0], [20, 21, 22, EOS_ID]])
  got = decoding.attention(ensemble, SOURCES, targets).numpy()
  first, second = (decoding.attention(member, SOURCES, targets).numpy() for member in pair)
  assert np.abs(first - second).max() > 0.05  # the members attend differently
  np.testing.assert_allclose(got, 0.7 * first + 0.3 * second, atol=1e-6)
  real = targets.numpy() != 0
  np.testing.assert_allclose(got.sum(axis=-1)[real], 1.0, atol=1e-5)


def test_the_ensemble_beam_is_an_exhaustive_search_on_a_toy_pair():
  """A target vocabulary of 5 (PAD and BOS, which no output holds, EOS and two words), outputs
  of at most 3 tokens: the 7 outputs that end in </s> are all kept by a beam of 8, best first
  by the ensemble's normalized score, which an exhaustive search over them finds by hand."""
  sizes = dict(vocab_size=5, d_model=8, num_heads=2, d_ff=16)
  first, second = _model(5, **sizes), _model(6, **sizes)
  ensemble = Ensemble((first, second), weights=(0.4, 0.6))
  words = [token for token in range(5) if token not in (PAD_ID, BOS_ID, EOS_ID)]
  source = words + words[:1] + [EOS_ID]
  search = DecodeConfig(beam_size=8, nbest=7, alpha=1.0, max_decode_length=3)
  ids, scores = decoding.decode(ensemble, tf.constant([source]), search)
  outputs = [tuple(output) + (EOS_ID,) for length in range(3)
             for output in itertools.product(words, repeat=length)]
  assert len(outputs) == 7
  exhaustive = {}
  for output in outputs:
    total = sum(weight * _hand_log_probs(member, source, list(output))
                for member, weight in zip(ensemble.members, ensemble.weights))
    exhaustive[output] = total / float(length_penalty(len(output), 1.0))
  ranked = sorted(outputs, key=exhaustive.get, reverse=True)
  found = [tuple(int(t) for t in row if t) for row in ids.numpy()[0, :7]]
  assert found == ranked
  np.testing.assert_allclose(scores.numpy()[0, :7], [exhaustive[o] for o in ranked], rtol=1e-5)


def test_an_ensemble_needs_two_members_their_weights_and_one_vocabulary(pair):
  with pytest.raises(ValueError, match="at least two models"):
    Ensemble(pair[:1])
  with pytest.raises(ValueError, match="needs as many weights > 0"):
    Ensemble(pair, weights=(1.0,))
  with pytest.raises(ValueError, match="needs as many weights > 0"):
    Ensemble(pair, weights=(1.0, 0.0))
  with pytest.raises(ValueError, match="share the target vocabulary"):
    Ensemble((pair[0], _model(7, vocab_size=30)))
