"""Position-wise feed-forward network that skips padded positions."""

import keras
import tensorflow as tf

from tf_transformer.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="tf_transformer")
class FeedForward(keras.layers.Layer):
  """FFN(x) = max(0, x W1 + b1) W2 + b2, "Attention Is All You Need" section 3.3.

  With `padding_aware`, the real positions are gathered into one [N, d_model] matrix before the
  two dense layers and the result is scattered back, so no FLOPs are spent on padding (token
  batches carry 10-40% padding). The values on real positions equal the plain dense FFN's;
  padded positions come out as zeros.
  """

  def __init__(self, d_ff: int, dropout_rate: float = 0.0, padding_aware: bool = True,
               **kwargs):
    super().__init__(**kwargs)
    self.d_ff = d_ff
    self.dropout_rate = dropout_rate
    self.padding_aware = padding_aware
    self._dropout = Dropout(dropout_rate, dtype=self.dtype_policy)

  def build(self, inputs_shape, padding_mask_shape=None):
    d_model = inputs_shape[-1]
    self.inner = keras.layers.Dense(self.d_ff, activation="relu", name="inner",
                                    dtype=self.dtype_policy)
    self.inner.build((None, d_model))
    self.outer = keras.layers.Dense(d_model, name="outer", dtype=self.dtype_policy)
    self.outer.build((None, self.d_ff))

  def _dense(self, x, training):
    """[N, d_model] -> [N, d_model]."""
    return self.outer(self._dropout(self.inner(x), training=training))

  def call(self, inputs, padding_mask=None, training=None):
    """Applies the FFN.

    Args:
      inputs: [batch, length, d_model].
      padding_mask: bool [batch, length], True at real tokens; required when `padding_aware`.
      training: enables the dropout after the ReLU.

    Returns:
      [batch, length, d_model]; zeros at padded positions when `padding_aware`.
    """
    if not self.padding_aware or padding_mask is None:
      shape = tf.shape(inputs)
      flat = self._dense(tf.reshape(inputs, [-1, shape[-1]]), training)
      return tf.reshape(flat, shape)
    indices = tf.where(padding_mask)  # -> [N, 2]
    real = self._dense(tf.gather_nd(inputs, indices), training)  # -> [N, d_model]
    return tf.scatter_nd(indices, real, tf.shape(inputs, out_type=tf.int64))

  def compute_output_shape(self, inputs_shape, *args, **kwargs):
    return inputs_shape

  def get_config(self):
    config = super().get_config()
    config.update(d_ff=self.d_ff, dropout_rate=self.dropout_rate,
                  padding_aware=self.padding_aware)
    return config
