"""Residual connection with dropout and layer normalization around a sublayer."""

import keras
import tensorflow as tf

from tf_transformer.layers.dropout import Dropout
from tf_transformer.layers.layer_norm import LayerNorm

NORM_POSITIONS = ("post", "pre")


@keras.saving.register_keras_serializable(package="tf_transformer")
class ResidualNorm(keras.layers.Layer):
  """Wraps a sublayer F as LayerNorm(x + Dropout(F(x))) or x + Dropout(F(LayerNorm(x))).

  "post" is the paper's arrangement (section 5.4: dropout on each sublayer output before it is
  added and normalized); "pre" normalizes the sublayer input instead, which trains more stably
  in deep stacks and needs a final layer norm after the stack.

  Usage: `y = sublayer(block.sublayer_input(x)); x = block(x, y)`.
  """

  def __init__(self, dropout_rate: float = 0.0, norm_position: str = "post",
               epsilon: float = 1e-6, **kwargs):
    super().__init__(**kwargs)
    if norm_position not in NORM_POSITIONS:
      raise ValueError(f"norm_position must be one of {NORM_POSITIONS}, got {norm_position!r}")
    self.dropout_rate = dropout_rate
    self.norm_position = norm_position
    self._dropout = Dropout(dropout_rate, dtype=self.dtype_policy)
    # layer norm runs in float32: its variance is too coarse in float16/bfloat16
    self.norm = LayerNorm(epsilon=epsilon, dtype="float32", name="norm")

  def build(self, inputs_shape, *args, **kwargs):
    self.norm.build(inputs_shape)

  def _normalize(self, x):
    return tf.cast(self.norm(tf.cast(x, tf.float32)), x.dtype)

  def sublayer_input(self, x):
    """x [batch, length, d_model] -> what the sublayer reads (normalized in "pre")."""
    return self._normalize(x) if self.norm_position == "pre" else x

  def call(self, inputs, sublayer_output, training=None):
    """inputs, sublayer_output: [batch, length, d_model] -> [batch, length, d_model]."""
    x = inputs + self._dropout(sublayer_output, training=training)
    return x if self.norm_position == "pre" else self._normalize(x)

  def compute_output_shape(self, inputs_shape, *args, **kwargs):
    return inputs_shape

  def get_config(self):
    config = super().get_config()
    config.update(dropout_rate=self.dropout_rate, norm_position=self.norm_position,
                  epsilon=self.norm.epsilon)
    return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class FinalNorm(keras.layers.Layer):
  """The layer norm after a pre-norm stack; the identity after a post-norm stack."""

  def __init__(self, norm_position: str = "post", epsilon: float = 1e-6, **kwargs):
    super().__init__(**kwargs)
    self.norm_position = norm_position
    self.epsilon = epsilon
    self.norm = None
    if norm_position == "pre":
      self.norm = LayerNorm(epsilon=epsilon, dtype="float32", name="norm")

  def build(self, inputs_shape):
    if self.norm is not None:
      self.norm.build(inputs_shape)

  def call(self, inputs):
    """inputs: [batch, length, d_model] -> same shape."""
    if self.norm is None:
      return inputs
    return tf.cast(self.norm(tf.cast(inputs, tf.float32)), inputs.dtype)

  def compute_output_shape(self, inputs_shape):
    return inputs_shape

  def get_config(self):
    config = super().get_config()
    config.update(norm_position=self.norm_position, epsilon=self.epsilon)
    return config
