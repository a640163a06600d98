"""Position-wise feed-forward network."""

import keras

import tensorflow as tf

from tf_transformer.layers import low_precision
from tf_transformer.layers.dropout import Dropout
from tf_transformer.layers.row_matmul import row_matmul


@keras.saving.register_keras_serializable(package="tf_transformer")
class FeedForward(keras.layers.Layer):
  """FFN(x) = max(0, x W1 + b1) W2 + b2, "Attention Is All You Need" section 3.3.

  It reads token rows [R, d_model] (see TokenLayout): with the model's `skip_padding` these are
  the real tokens only, so no FLOPs are spent on padding.
  """

  def __init__(self, d_ff: int, dropout_rate: float = 0.0, **kwargs):
    super().__init__(**kwargs)
    self.d_ff = d_ff
    self.dropout_rate = dropout_rate
    self._dropout = Dropout(dropout_rate, dtype=self.dtype_policy)
    # {"inner", "outer": LowPrecisionKernel}, filled by low_precision.convert for inference
    self.low_precision = {}

  def build(self, inputs_shape):
    d_model = inputs_shape[-1]
    # holds the first layer's weights; `call` applies them (and the ReLU) with row_matmul
    self.inner = keras.layers.Dense(self.d_ff, name="inner", dtype=self.dtype_policy)
    self.inner.build((None, d_model))
    self.outer = keras.layers.Dense(d_model, name="outer", dtype=self.dtype_policy)
    self.outer.build((None, self.d_ff))

  def kernels_for_inference(self) -> dict:
    """The weight matrices by name (see low_precision.convert)."""
    return {"inner": self.inner.kernel, "outer": self.outer.kernel}

  def call(self, inputs, training=None, static_rows=False):
    """inputs: [R, d_model] token rows -> [R, d_model]; `training` enables the dropout after
    the ReLU; `static_rows`: R is every position of a padded batch (see
    low_precision.LowPrecisionKernel.matmul)."""
    if self.low_precision:
      hidden = low_precision.matmul(inputs, self.low_precision["inner"], self.inner.bias,
                                    relu=True, static_rows=static_rows)
      outputs = low_precision.matmul(hidden, self.low_precision["outer"], self.outer.bias,
                                     static_rows=static_rows)
      return tf.cast(outputs, self.compute_dtype)
    # row_matmul's input gradient is faster on CPU for the first layer's [d_model, d_ff]
    # kernel; the second layer's, taller than wide, gains nothing from it
    hidden = row_matmul(inputs, tf.cast(self.inner.kernel, self.compute_dtype),
                        tf.cast(self.inner.bias, self.compute_dtype), relu=True)
    return self.outer(self._dropout(hidden, training=training))

  def compute_output_shape(self, inputs_shape):
    return inputs_shape

  def get_config(self):
    config = super().get_config()
    config.update(d_ff=self.d_ff, dropout_rate=self.dropout_rate)
    return config
