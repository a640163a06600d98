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


def test_halves_layout_puts_the_sines_then_the_cosines():
  """Marian's layout: PE[pos, i] = sin(angle_i), PE[pos, d/2 + i] = cos(angle_i), with the
  paper's angles pos / 10000^(2i/d)."""
  positions, d_model = np.arange(40), 16
  pe = positional_encoding(tf.constant(positions), d_model, layout="halves").numpy()
  paper = _reference_pe(positions, d_model)
  np.testing.assert_allclose(pe[:, :d_model // 2], paper[:, 0::2], atol=1e-5)
  np.testing.assert_allclose(pe[:, d_model // 2:], paper[:, 1::2], atol=1e-5)
  with pytest.raises(ValueError, match="layout"):
    positional_encoding(tf.range(3), 8, layout="mixed")


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


def test_an_unscaled_embedding_adds_the_positions_to_the_rows_as_they_are():
  keras.utils.set_random_seed(0)
  layer = SharedEmbedding(50, 16, scale=False, sinusoid_layout="halves")
  layer.build()
  ids = np.array([[4, 17, 0]], np.int32)
  table = layer.embeddings.numpy().astype(np.float64)
  pe = np.asarray(positional_encoding(tf.range(3), 16, layout="halves"), np.float64)
  expected = (table[ids] + pe[np.newaxis]) * (ids != 0)[..., np.newaxis]
  np.testing.assert_allclose(layer(tf.constant(ids)).numpy(), expected, atol=1e-5)


def test_the_output_bias_is_added_to_the_logits_and_to_each_shortlists_columns():
  vocab, d_model = 50, 16
  keras.utils.set_random_seed(0)
  layer = SharedEmbedding(vocab, d_model, output_bias=True)
  layer.build()
  rng = np.random.default_rng(2)
  bias = rng.normal(size=vocab).astype(np.float32)
  layer.output_bias.assign(bias)
  hidden = rng.normal(size=(2, 3, d_model)).astype(np.float32)
  table = layer.embeddings.numpy().astype(np.float64)
  expected = hidden.astype(np.float64) @ table.T + bias
  np.testing.assert_allclose(layer.logits(tf.constant(hidden)).numpy(), expected, atol=1e-5)
  # a decoding step's shortlist: each sentence's columns of the kernel and of the bias
  ids = np.array([[3, 7, 49], [0, 5, 6]], np.int32)
  kernel = layer.output_kernel(tf.constant(ids))
  columns = layer.output_bias_columns(tf.constant(ids))
  got = layer.logits(tf.constant(hidden), kernel, columns).numpy()  # [2, 3, 3]
  for b in range(2):
    np.testing.assert_allclose(got[b], expected[b][:, ids[b]], atol=1e-5)
  assert SharedEmbedding(vocab, d_model).output_bias_columns() is None


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
