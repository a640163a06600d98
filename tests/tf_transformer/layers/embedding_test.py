"""Tests of tf_transformer/layers/embedding.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.layers.embedding import SharedEmbedding, positional_encoding


def _reference_pe(positions, d_model):
  """float64 PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same)."""
  pe = np.zeros((len(positions), d_model), np.float64)
  for p, pos in enumerate(positions):
    for i in range(d_model // 2):
      angle = pos / 10000.0 ** (2.0 * i / d_model)
      pe[p, 2 * i] = np.sin(angle)
      pe[p, 2 * i + 1] = np.cos(angle)
  return pe


@pytest.mark.parametrize("d_model", [16, 512])
def test_positional_encoding_matches_paper_formula(d_model):
  positions = np.arange(51)
  pe = positional_encoding(tf.constant(positions, tf.int32), d_model).numpy()
  assert pe.shape == (51, d_model)
  assert pe.dtype == np.float32
  np.testing.assert_allclose(pe, _reference_pe(positions, d_model), rtol=0, atol=1e-5)


def test_positional_encoding_batched_positions_and_odd_width():
  positions = tf.constant([[0, 3], [7, 2]], tf.int32)
  pe = positional_encoding(positions, 8).numpy()
  assert pe.shape == (2, 2, 8)
  ref = _reference_pe([0, 3, 7, 2], 8).reshape(2, 2, 8)
  np.testing.assert_allclose(pe, ref, atol=1e-6)
  with pytest.raises(ValueError):
    positional_encoding(tf.range(3), 7)


def _layer(vocab=50, d_model=16):
  keras.utils.set_random_seed(0)
  layer = SharedEmbedding(vocab, d_model)
  layer.build()
  return layer


def test_shared_embedding_scales_adds_positions_and_zeroes_pads():
  vocab, d_model = 50, 16
  layer = _layer(vocab, d_model)
  ids = np.array([[4, 17, 9, 0, 0], [0, 2, 49, 3, 0]], np.int32)
  out = layer(tf.constant(ids)).numpy()
  assert out.shape == (2, 5, d_model)
  table = layer.embeddings.numpy().astype(np.float64)
  pe = _reference_pe(range(5), d_model)
  expected = table[ids] * np.sqrt(d_model) + pe[np.newaxis]
  expected *= (ids != 0)[..., np.newaxis]
  np.testing.assert_allclose(out, expected, atol=1e-5)
  np.testing.assert_array_equal(out[ids == 0], 0.0)


def test_shared_embedding_embed_uses_given_positions():
  d_model = 16
  layer = _layer(50, d_model)
  ids = np.array([[8], [11]], np.int32)
  out = layer.embed(tf.constant(ids), tf.constant([6])).numpy()
  table = layer.embeddings.numpy().astype(np.float64)
  expected = table[ids] * np.sqrt(d_model) + _reference_pe([6], d_model)[np.newaxis]
  np.testing.assert_allclose(out, expected, atol=1e-5)


def test_shared_embedding_logits_are_hidden_times_embedding_transpose():
  vocab, d_model = 50, 16
  layer = _layer(vocab, d_model)
  hidden = np.random.default_rng(1).normal(size=(2, 3, d_model)).astype(np.float32)
  logits = layer.logits(tf.constant(hidden)).numpy()
  assert logits.shape == (2, 3, vocab)
  assert logits.dtype == np.float32
  expected = hidden.astype(np.float64) @ layer.embeddings.numpy().astype(np.float64).T
  np.testing.assert_allclose(logits, expected, atol=1e-5)


def test_shared_embedding_config_round_trip():
  layer = _layer(50, 16)
  config = layer.get_config()
  assert config["vocab_size"] == 50 and config["d_model"] == 16
  clone = SharedEmbedding.from_config(config)
  clone.build()
  clone.set_weights(layer.get_weights())
  ids = tf.constant([[1, 5, 0]], tf.int32)
  np.testing.assert_array_equal(clone(ids).numpy(), layer(ids).numpy())
  assert clone.embeddings.shape == (50, 16)
