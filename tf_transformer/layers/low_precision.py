"""Weight matrices in 8 or 16 bits for inference, and their products with float32 rows.

A decoding step multiplies a few rows (the beam of one sentence: 1 to 4) by every weight
matrix of the decoder and by the output projection, so it is bound by the bytes of weights it
reads, not by arithmetic: the matrices in int8 are a quarter of the float32 bytes.

- "int8": dynamic-range quantisation, as CTranslate2's int8 does. Each kernel column has its
  own scale (max |w| / 127, fixed at conversion); each row of activations is quantised with its
  own scale when it is multiplied; the product runs in int8 with int32 sums and is rescaled to
  float32. XLA compiles it (tensorflow ops only, so TF Serving runs it as it is).
- "bfloat16": kernels and rows rounded to bfloat16 for the product, the result back in float32.

Everything else (embeddings, layer norms, biases, attention over the cached keys and values,
softmax) stays in float32.
"""

import copy

import keras
import numpy as np
import tensorflow as tf

PRECISIONS = ("float32", "bfloat16", "int8")


class LowPrecisionKernel:
  """A kernel [d_in, d_out] stored in `precision`, for `rows @ kernel` in inference.

  It holds tf.Variables (the module that saves it tracks them: see `convert`), and is not
  itself tracked by the Keras layer it is attached to.
  """

  def __init__(self, kernel, precision: str, name: str):
    """kernel: float [d_in, d_out] (a variable or an array); precision: "bfloat16" or "int8"."""
    if precision not in PRECISIONS[1:]:
      raise ValueError(f"precision must be one of {PRECISIONS[1:]}, got {precision!r}")
    self.precision = precision
    kernel = np.asarray(kernel, np.float32)
    if precision == "int8":
      values, scale = keras.quantizers.abs_max_quantize(kernel, axis=0, to_numpy=True)
      self.values = tf.Variable(np.asarray(values, np.int8), trainable=False,
                                name=f"{name}_int8")
      # 1 / (127 / max |w|): a product rescales by multiplying, not dividing
      self.scale = tf.Variable(1.0 / np.asarray(scale, np.float32), trainable=False,
                               name=f"{name}_scale")  # [1, d_out]
    else:
      self.values = tf.Variable(tf.cast(kernel, tf.bfloat16), trainable=False,
                                name=f"{name}_bfloat16")
      self.scale = None

  @property
  def variables(self) -> list:
    return [self.values] + ([self.scale] if self.scale is not None else [])

  @property
  def shape(self):
    return self.values.shape

  def columns(self, ids) -> "LowPrecisionKernel":
    """The columns `ids` (int32 [n]) of this kernel: a LowPrecisionKernel [d_in, n] of tensors,
    not variables (a search's vocabulary shortlist). An int8 column keeps its scale, so a
    product with it equals that column of the product with the whole kernel."""
    selected = copy.copy(self)
    selected.values = tf.gather(self.values, ids, axis=1)
    selected.scale = None if self.scale is None else tf.gather(self.scale, ids, axis=1)
    return selected

  def matmul(self, rows, static_rows: bool = False):
    """rows float32 [R, d_in] -> float32 [R, d_out], close to rows @ kernel.

    static_rows: R is fixed when XLA compiles the product (every position of a padded batch
    is a row, as in a decoding step), not a count of real tokens. An odd R then gets a row of
    zeros: XLA's CPU backend multiplies 2 or more int8 rows in int8, but one row in int32,
    widening the whole kernel on every call (7 ms a sentence at small dims, greedy).

    int8 error per output element: at most about (|row| max * |kernel column| max) * d_in /
    127**2 in the worst case, far less on average (rounding errors of both sides cancel).
    """
    rows = tf.cast(rows, tf.float32)
    if self.precision == "bfloat16":
      return tf.cast(tf.matmul(tf.cast(rows, tf.bfloat16), self.values), tf.float32)
    quantized, row_scale = keras.quantizers.abs_max_quantize(rows, axis=-1)  # [R, d_in], [R, 1]
    if static_rows:
      count = tf.shape(quantized)[0]
      even = tf.pad(quantized, [[0, tf.math.floormod(count, 2)], [0, 0]])
      sums = tf.linalg.matmul(even, self.values, output_type=tf.int32)[:count]
    else:
      sums = tf.linalg.matmul(quantized, self.values, output_type=tf.int32)
    return tf.cast(sums, tf.float32) * (self.scale / row_scale)


def matmul(rows, kernel, bias=None, relu: bool = False, static_rows: bool = False):
  """max(0, rows @ kernel + bias) (bias and ReLU optional) with a LowPrecisionKernel:
  float32 [R, d_out]. static_rows: see LowPrecisionKernel.matmul."""
  outputs = kernel.matmul(rows, static_rows)
  if bias is not None:
    outputs = tf.nn.bias_add(outputs, tf.cast(bias, tf.float32))
  return tf.nn.relu(outputs) if relu else outputs


def convert(model, precision: str):
  """Gives every weight matrix of `model`'s matrix products a `precision` copy for inference.

  The attention projections and the feed-forward layers of the encoder and decoder, and the
  pre-softmax projection (a transposed copy: the embedding lookup keeps the float32 matrix).
  The model then decodes with the copies; it should not be trained any more.

  Args:
    model: a Transformer in float32 compute.
    precision: one of PRECISIONS; "float32" changes nothing.

  Returns:
    (added, replaced): the new variables, and the float32 variables that inference no longer
    reads (a module saving the model for inference saves the first and not the second).
  """
  if precision not in PRECISIONS:
    raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
  if precision == "float32":
    return [], []
  added, replaced = [], []
  for layer in _layers_with_kernels(model):
    for name, variable in layer.kernels_for_inference().items():
      low = LowPrecisionKernel(variable.numpy(), precision, f"{layer.name}_{name}")
      layer.low_precision[name] = low
      added += low.variables
      replaced.append(variable)
  embedding = model.target_embedding
  output_kernel = LowPrecisionKernel(np.transpose(embedding.embeddings.numpy()), precision,
                                     f"{embedding.name}_output_kernel")
  embedding.low_precision["output_kernel"] = output_kernel
  added += output_kernel.variables
  return added, replaced


def _layers_with_kernels(model):
  """The MultiHeadAttention and FeedForward layers of `model`'s encoder and decoder."""
  return [getattr(layer, name) for stack in (model.encoder, model.decoder)
          for layer in stack.stack for name in ("self_attention", "cross_attention", "ffn")
          if hasattr(layer, name)]
