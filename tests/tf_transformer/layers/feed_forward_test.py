"""Tests of tf_transformer/layers/feed_forward.py against a float64 numpy reference."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.layers.feed_forward import FeedForward

D_MODEL, D_FF = 16, 32


def _layer(seed=0, dropout_rate=0.0, activation="relu"):
  keras.utils.set_random_seed(seed)
  layer = FeedForward(D_FF, dropout_rate, activation)
  layer.build((None, D_MODEL))
  return layer


# float64 references of the activations, from their definitions
_ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "swish": lambda x: x / (1.0 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
}


def _numpy_ffn(x, layer, activation="relu"):
  w1, b1, w2, b2 = [w.astype(np.float64) for w in layer.get_weights()]
  return _ACTIVATIONS[activation](x.astype(np.float64) @ w1 + b1) @ w2 + b2


def test_feed_forward_matches_numpy_reference():
  layer = _layer()
  x = np.random.default_rng(0).normal(size=(7, D_MODEL)).astype(np.float32)
  out = layer(tf.constant(x), training=False).numpy()
  np.testing.assert_allclose(out, _numpy_ffn(x, layer), atol=1e-5)
  # each row is computed on its own: a row's output does not depend on the others
  np.testing.assert_allclose(layer(tf.constant(x[2:3]), training=False).numpy(), out[2:3],
                             atol=1e-6)


@pytest.mark.parametrize("activation", ["swish", "gelu"])
def test_other_activations_match_their_definitions(activation):
  layer = _layer(activation=activation)
  rng = np.random.default_rng(1)
  layer.inner.bias.assign(rng.normal(size=D_FF).astype(np.float32))
  x = rng.normal(size=(7, D_MODEL)).astype(np.float32)
  out = layer(tf.constant(x), training=False).numpy()
  np.testing.assert_allclose(out, _numpy_ffn(x, layer, activation), atol=1e-5)
  # and not ReLU's: the inputs reach negative pre-activations
  assert np.abs(out - _numpy_ffn(x, layer, "relu")).max() > 1e-2
  assert FeedForward.from_config(layer.get_config()).activation == activation
  with pytest.raises(ValueError, match="activation"):
    FeedForward(D_FF, activation="tanh")


def test_relu_dropout_only_in_training():
  layer = _layer(dropout_rate=0.5)
  x = tf.random.stateless_normal([64, D_MODEL], seed=[1, 2])
  np.testing.assert_allclose(layer(x, training=False).numpy(), _numpy_ffn(x.numpy(), layer),
                             atol=1e-5)
  assert np.abs(layer(x, training=True).numpy() - layer(x, training=False).numpy()).max() > 1e-3


def test_feed_forward_config_round_trip():
  layer = _layer(dropout_rate=0.2)
  config = layer.get_config()
  assert config["d_ff"] == D_FF and config["dropout_rate"] == 0.2
  clone = FeedForward.from_config(config)
  clone.build((None, D_MODEL))
  clone.set_weights(layer.get_weights())
  x = tf.random.stateless_normal([4, D_MODEL], seed=[5, 6])
  np.testing.assert_array_equal(clone(x).numpy(), layer(x).numpy())
