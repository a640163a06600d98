"""Position-wise feed-forward network."""

import keras
import tensorflow as tf

from tf_transformer.layers.dropout import Dropout
from tf_transformer.layers.precisions import Float32Kernel

# the activations between the two products: relu (the paper's), swish (x * sigmoid(x), also
# called SiLU: Marian's) and gelu (the exact one, with erf)
ACTIVATIONS = {"relu": tf.nn.relu, "swish": tf.nn.silu,
               "gelu": lambda x: tf.nn.gelu(x, approximate=False)}


@keras.saving.register_keras_serializable(package="tf_transformer")
class FeedForward(keras.layers.Layer):
  """FFN(x) = max(0, x W1 + b1) W2 + b2, "Attention Is All You Need" section 3.3 (or another
  of ACTIVATIONS in place of the max).

  It reads token rows [R, d_model] (see TokenLayout): with the model's `skip_padding` these are
  the real tokens only, so no FLOPs are spent on padding.
  """

  def __init__(self, d_ff: int, dropout_rate: float = 0.0, activation: str = "relu", **kwargs):
    super().__init__(**kwargs)
    if activation not in ACTIVATIONS:
      raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    self.d_ff = d_ff
    self.activation = activation
    self.dropout_rate = dropout_rate
    self._dropout = Dropout(dropout_rate, dtype=self.dtype_policy)
    # {"inner", "outer": precisions.Kernel}: the products' weights (precisions.convert
    # replaces them with reduced-precision copies for inference)
    self.kernels = {}

  def build(self, inputs_shape):
    d_model = inputs_shape[-1]
    # hold the weights (their checkpoint names); `call` multiplies by them through `kernels`
    self.inner = keras.layers.Dense(self.d_ff, name="inner", dtype=self.dtype_policy)
    self.inner.build((None, d_model))
    self.outer = keras.layers.Dense(d_model, name="outer", dtype=self.dtype_policy)
    self.outer.build((None, self.d_ff))
    # row_matmul's input gradient is faster on CPU for the first layer's [d_model, d_ff]
    # kernel; the second layer's, taller than wide, gains nothing from it
    self.kernels = {"inner": Float32Kernel(self.inner.kernel),
                    "outer": Float32Kernel(self.outer.kernel, fast_input_gradient=False)}

  def kernels_for_inference(self) -> dict:
    """The weight matrices by name (see precisions.convert)."""
    return {"inner": self.inner.kernel, "outer": self.outer.kernel}

  def call(self, inputs, training=None, static_rows=False):
    """inputs: [R, d_model] token rows -> [R, d_model]; `training` enables the dropout after
    the activation; `static_rows`: R is every position of a padded batch (see
    precisions.Kernel.matmul)."""
    inner, outer = self.kernels["inner"], self.kernels["outer"]
    relu = self.activation == "relu"  # fused into the product
    hidden = inner.matmul(inputs, self.inner.bias, relu=relu, static_rows=static_rows)
    if not relu:
      hidden = ACTIVATIONS[self.activation](hidden)
    return outer.matmul(self._dropout(hidden, training=training), self.outer.bias,
                        static_rows=static_rows)

  def compute_output_shape(self, inputs_shape):
    return inputs_shape

  def get_config(self):
    config = super().get_config()
    config.update(d_ff=self.d_ff, dropout_rate=self.dropout_rate, activation=self.activation)
    return config
