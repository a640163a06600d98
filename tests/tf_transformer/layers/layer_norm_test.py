"""Tests of the layer norm with a hand-written gradient, against a float64 reference."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.layers.layer_norm import LayerNorm

EPSILON = 1e-6


def reference(x, gamma, beta, dy):
  """Float64 values and gradients of the layer norm by the textbook formulas, x [..., d]."""
  x, gamma, beta, dy = (np.asarray(a, np.float64) for a in (x, gamma, beta, dy))
  mean = x.mean(-1, keepdims=True)
  variance = ((x - mean)**2).mean(-1, keepdims=True)
  normalized = (x - mean) / np.sqrt(variance + EPSILON)
  y = normalized * gamma + beta
  d = x.shape[-1]
  batch_axes = tuple(range(x.ndim - 1))
  d_normalized = dy * gamma
  # d normalized_i / d x_j = (delta_ij - 1/d - normalized_i normalized_j / d) / sigma
  d_x = (d_normalized - d_normalized.mean(-1, keepdims=True) - normalized *
         (d_normalized * normalized).sum(-1, keepdims=True) / d) / np.sqrt(variance + EPSILON)
  return y, d_x, (dy * normalized).sum(batch_axes), dy.sum(batch_axes)


def finite_difference_d_x(x, gamma, beta, dy, i):
  """d sum(y * dy) / d x[i] by central differences in float64, i an index into x."""
  step = 1e-6

  def objective(shifted):
    return (reference(shifted, gamma, beta, dy)[0] * dy).sum()

  plus, minus = x.astype(np.float64), x.astype(np.float64)
  plus[i] += step
  minus[i] -= step
  return (objective(plus) - objective(minus)) / (2 * step)


@pytest.mark.parametrize("shape", [[37, 16], [3, 7, 16]])
def test_values_and_gradients_match_the_float64_reference(shape):
  rng = np.random.default_rng(0)
  x = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
  dy = rng.normal(size=shape).astype(np.float32)
  layer = LayerNorm(epsilon=EPSILON, dtype="float32")
  layer.build(shape)
  layer.gamma.assign(rng.normal(size=shape[-1:]).astype(np.float32))
  layer.beta.assign(rng.normal(size=shape[-1:]).astype(np.float32))
  x_tensor = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(x_tensor)
    y = layer(x_tensor)
  d_x, d_gamma, d_beta = tape.gradient(y, [x_tensor, layer.gamma, layer.beta],
                                       output_gradients=tf.constant(dy))
  want = reference(x, layer.gamma.numpy(), layer.beta.numpy(), dy)
  for got, expected in zip([y, d_x, d_gamma, d_beta], want):
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4)
  # the reference's own gradient formula, checked by finite differences
  index = tuple(s // 2 for s in shape)
  np.testing.assert_allclose(
      want[1][index], finite_difference_d_x(x, layer.gamma.numpy(), layer.beta.numpy(), dy, index),
      rtol=1e-5)


def test_a_constant_row_normalizes_to_beta_with_finite_gradients():
  """A row without variance: epsilon keeps the division finite."""
  layer = LayerNorm(epsilon=EPSILON, dtype="float32")
  layer.build([2, 8])
  layer.beta.assign(tf.range(8, dtype=tf.float32))
  x = tf.constant([[2.5] * 8, list(range(8))], tf.float32)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x)
  d_x = tape.gradient(y, x)
  np.testing.assert_allclose(y[0].numpy(), np.arange(8), atol=1e-6)
  assert np.all(np.isfinite(d_x.numpy()))


def test_restores_a_checkpoint_of_keras_layer_normalization(tmp_path):
  """Checkpoints written while the model used keras.layers.LayerNormalization still load."""
  x = tf.random.stateless_normal([5, 12], seed=[1, 2])
  old = keras.layers.LayerNormalization(epsilon=EPSILON)
  old.build(x.shape)
  old.gamma.assign(tf.random.stateless_normal([12], seed=[3, 4]))
  old.beta.assign(tf.random.stateless_normal([12], seed=[5, 6]))
  path = tf.train.Checkpoint(norm=old).save(str(tmp_path / "ckpt"))
  new = LayerNorm(epsilon=EPSILON)
  new.build(x.shape)
  tf.train.Checkpoint(norm=new).restore(path).assert_consumed()
  np.testing.assert_allclose(new(x).numpy(), old(x).numpy(), atol=1e-5)
