"""Tests of the 16-bit dropout: its statistics, its gradient and its randomness."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.layers.dropout import Dropout


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_drops_the_rate_and_scales_the_rest(rate):
  x = tf.random.stateless_uniform([999, 1001], seed=[1, 2], minval=0.5, maxval=1.5)  # odd size
  y = Dropout(rate, seed=3)(x, training=True).numpy()
  dropped = y == 0.0
  n = dropped.size
  assert abs(dropped.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / n)  # ~1e-3 here
  np.testing.assert_allclose(y[~dropped], x.numpy()[~dropped] / (1 - rate), rtol=1e-4)
  # the scale makes the expected output the input
  assert abs(y.sum() / x.numpy().sum() - 1.0) < 3e-3


def test_draws_are_independent_across_positions():
  """Neighbouring elements (the two halves of one random word) drop independently."""
  y = Dropout(0.5, seed=4)(tf.ones([2_000_000]), training=True).numpy() == 0
  pairs = y.reshape(-1, 2)
  both = np.mean(pairs[:, 0] & pairs[:, 1])
  assert abs(both - 0.25) < 4 * np.sqrt(0.25 * 0.75 / len(pairs))


def test_identity_outside_training_and_at_rate_zero():
  x = tf.random.normal([3, 5])
  assert Dropout(0.3)(x, training=False) is x
  assert Dropout(0.0)(x, training=True) is x


def test_gradient_is_the_mask_times_the_scale():
  x = tf.random.normal([64, 33])
  layer = Dropout(0.25, seed=5)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x, training=True)
  gradient = tape.gradient(y, x).numpy()
  kept = y.numpy() != 0.0
  np.testing.assert_array_equal(gradient[kept], np.full(kept.sum(), 1 / 0.75, np.float32))
  np.testing.assert_array_equal(gradient[~kept], 0.0)


def test_a_new_mask_each_call_and_the_same_masks_from_the_same_seed():
  x = tf.ones([40, 40])

  def masks():
    keras.utils.set_random_seed(7)
    layer = Dropout(0.5)
    return [layer(x, training=True).numpy() == 0 for _ in range(2)]

  first, second = masks()
  assert (first != second).mean() > 0.3
  again = masks()
  np.testing.assert_array_equal(first, again[0])
  np.testing.assert_array_equal(second, again[1])


def test_mixed_bfloat16_computes_in_bfloat16():
  y = Dropout(0.1, seed=1, dtype="mixed_bfloat16")(tf.ones([8, 8]), training=True)
  assert y.dtype == tf.bfloat16 and set(np.unique(y.numpy().astype(np.float32))) <= {
      0.0, float(tf.cast(1 / 0.9, tf.bfloat16))}


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_rejects_rates_outside_zero_to_one(rate):
  with pytest.raises(ValueError, match="dropout rate must be in"):
    Dropout(rate)
