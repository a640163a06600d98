"""Layer normalization over the last axis with a hand-written gradient."""

import keras
import tensorflow as tf


def layer_norm(x, gamma, beta, epsilon: float):
  """(x - mean) / sqrt(variance + epsilon) * gamma + beta over the last axis.

  The gradient is written out (Ba et al., 2016): autodiff of the mean/variance graph keeps x,
  the centred values and several broadcast intermediates for the backward pass and runs about
  twice as many elementwise passes over [..., d]; this keeps only the normalized values and
  one inverse deviation per row.

  Args:
    x: float32 [..., d].
    gamma, beta: float32 [d].
    epsilon: added to the variance.

  Returns:
    float32 [..., d].
  """

  @tf.custom_gradient
  def normalize(x, gamma, beta):
    centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    inverse_deviation = tf.math.rsqrt(
        tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True) + epsilon)  # -> [..., 1]
    normalized = centered * inverse_deviation

    def gradient(dy):
      batch_axes = tf.range(tf.rank(dy) - 1)
      d_gamma = tf.reduce_sum(dy * normalized, axis=batch_axes)
      d_beta = tf.reduce_sum(dy, axis=batch_axes)
      d_normalized = dy * gamma
      d_x = inverse_deviation * (
          d_normalized - tf.reduce_mean(d_normalized, axis=-1, keepdims=True)
          - normalized * tf.reduce_mean(d_normalized * normalized, axis=-1, keepdims=True))
      return d_x, d_gamma, d_beta

    return normalized * gamma + beta, gradient

  return normalize(x, gamma, beta)


@keras.saving.register_keras_serializable(package="tf_transformer")
class LayerNorm(keras.layers.LayerNormalization):
  """keras.layers.LayerNormalization over the last axis, computed by `layer_norm`.

  The same weights (gamma, beta) under the same names, so checkpoints of either load into the
  other. It always computes in float32 (the variance is too coarse in bfloat16/float16): give
  it dtype="float32" and cast around it.
  """

  def __init__(self, epsilon: float = 1e-6, **kwargs):
    super().__init__(axis=-1, epsilon=epsilon, **kwargs)

  def call(self, inputs):
    """inputs: float32 [..., d] -> float32 [..., d]."""
    return layer_norm(inputs, tf.convert_to_tensor(self.gamma), tf.convert_to_tensor(self.beta),
                      self.epsilon)

  def get_config(self):
    config = super().get_config()
    del config["axis"]  # always the last
    return config
