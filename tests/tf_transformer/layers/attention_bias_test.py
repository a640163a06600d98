"""Tests of tf_transformer/layers/attention_bias.py."""

import numpy as np
import tensorflow as tf

from tf_transformer.layers import attention_bias


def test_padding_bias_hand_example():
  ids = tf.constant([[5, 7, 0, 0], [3, 0, 9, 0]], tf.int32)
  bias = attention_bias.padding_bias(ids).numpy()
  assert bias.shape == (2, 1, 1, 4)
  assert bias.dtype == np.float32
  neg = -1e9  # by hand: what every masked position must receive in float32
  expected = np.array([[0, 0, neg, neg], [0, neg, 0, neg]], np.float32)
  np.testing.assert_array_equal(bias[:, 0, 0, :], expected)


def test_causal_bias_zero_on_and_below_diagonal():
  length = 5
  bias = attention_bias.causal_bias(length).numpy()
  assert bias.shape == (1, 1, length, length)
  neg = -1e9  # by hand: what every masked position must receive in float32
  for i in range(length):
    for j in range(length):
      assert bias[0, 0, i, j] == (0.0 if j <= i else neg), (i, j)


def test_decoder_self_attention_bias_combines_causal_and_padding():
  ids = tf.constant([[4, 6, 0]], tf.int32)
  bias = attention_bias.decoder_self_attention_bias(ids).numpy()
  assert bias.shape == (1, 1, 3, 3)
  neg = -1e9  # by hand: what every masked position must receive in float32
  expected = np.array([[0, neg, neg], [0, 0, neg], [0, 0, neg]], np.float32)
  np.testing.assert_array_equal(bias[0, 0], expected)


def test_large_negative_float16_is_finite_and_masks_exactly():
  neg = attention_bias.large_negative(tf.float16)
  assert np.isfinite(np.float16(neg))
  assert np.float16(neg) < -1000
  ids = tf.constant([[3, 4, 0]], tf.int32)
  bias16 = attention_bias.padding_bias(ids, tf.float16)
  assert bias16.dtype == tf.float16
  assert np.all(np.isfinite(bias16.numpy()))
  causal16 = attention_bias.causal_bias(3, tf.float16)
  assert np.all(np.isfinite(causal16.numpy()))
  logits = tf.constant([[[[2.0, -1.0, 8.0]]]], tf.float16)
  weights = tf.nn.softmax(logits + bias16).numpy()
  assert weights.dtype == np.float16
  assert weights[0, 0, 0, 2] == 0.0
  assert np.all(np.isfinite(weights))
  np.testing.assert_allclose(weights.astype(np.float64).sum(), 1.0, atol=1e-3)


def test_cached_step_bias_hides_the_slots_not_written_yet():
  bias = attention_bias.cached_step_bias(5, tf.constant(2)).numpy()
  assert bias.shape == (1, 1, 1, 5)
  np.testing.assert_array_equal(bias[0, 0, 0], [0.0, 0.0, 0.0, -1e9, -1e9])
  # it is the causal bias's row for that position, over the whole buffer
  np.testing.assert_array_equal(bias[0, 0, 0], attention_bias.causal_bias(5).numpy()[0, 0, 2])
