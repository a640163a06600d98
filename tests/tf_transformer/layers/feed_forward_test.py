"""Tests of tf_transformer/layers/feed_forward.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.layers.feed_forward import FeedForward

D_MODEL, D_FF = 16, 32


def _pair():
  keras.utils.set_random_seed(0)
  aware = FeedForward(D_FF, 0.0, padding_aware=True)
  aware.build((None, None, D_MODEL))
  plain = FeedForward(D_FF, 0.0, padding_aware=False)
  plain.build((None, None, D_MODEL))
  plain.set_weights(aware.get_weights())
  return aware, plain


def _numpy_ffn(x, layer):
  w1, b1, w2, b2 = [w.astype(np.float64) for w in layer.get_weights()]
  return np.maximum(x.astype(np.float64) @ w1 + b1, 0.0) @ w2 + b2


def _check(mask):
  aware, plain = _pair()
  rng = np.random.default_rng(0)
  x = rng.normal(size=mask.shape + (D_MODEL,)).astype(np.float32)
  out = aware(tf.constant(x), padding_mask=tf.constant(mask), training=False).numpy()
  dense = plain(tf.constant(x), padding_mask=tf.constant(mask), training=False).numpy()
  assert out.shape == x.shape
  np.testing.assert_allclose(out[mask], dense[mask], rtol=0, atol=1e-6)
  np.testing.assert_allclose(dense, _numpy_ffn(x, aware), atol=1e-5)
  np.testing.assert_array_equal(out[~mask], 0.0)


@pytest.mark.parametrize("mask", [
    [[True, True, True, False, False], [True, False, True, True, False]],
    [[True, True, False, False], [False, False, False, False]],  # an all-pad row
    [[True, True, True], [True, True, True]],  # no padding
], ids=["mixed", "all_pad_row", "no_pad"])
def test_padding_aware_ffn_equals_dense_ffn_on_real_positions(mask):
  _check(np.array(mask))


def test_padding_aware_ffn_without_mask_runs_dense_path():
  aware, plain = _pair()
  x = tf.random.stateless_normal([2, 3, D_MODEL], seed=[3, 4])
  np.testing.assert_allclose(aware(x, training=False).numpy(), plain(x, training=False).numpy(),
                             atol=1e-6)


def test_feed_forward_config_round_trip():
  aware, _ = _pair()
  config = aware.get_config()
  assert config["d_ff"] == D_FF and config["padding_aware"] is True
  clone = FeedForward.from_config(config)
  clone.build((None, None, D_MODEL))
  clone.set_weights(aware.get_weights())
  x = tf.random.stateless_normal([1, 4, D_MODEL], seed=[5, 6])
  mask = tf.constant([[True, True, True, False]])
  np.testing.assert_array_equal(clone(x, padding_mask=mask).numpy(),
                                aware(x, padding_mask=mask).numpy())
