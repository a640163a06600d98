"""How a layer multiplies rows by a weight matrix: one `Kernel` class a precision, in a registry.

Every projection of the layers (attention, feed-forward, the pre-softmax matrix) goes through
`layer.kernels[name].matmul(rows, ...)`. A layer is built with `Float32Kernel`s over its own
variables (the weights as trained, in the layer's compute dtype: training and a float32
export); `convert` replaces them with copies in another precision for inference. Adding a
precision is writing one Kernel class and naming it in PRECISIONS.

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

from tf_transformer.layers.row_matmul import row_matmul


class Kernel:
  """A weight matrix [d_in, d_out] as a layer multiplies rows by it."""

  def matmul(self, rows, bias=None, relu: bool = False, column_scale=None,
             static_rows: bool = False):
    """max(0, (rows @ kernel) * column_scale + bias) (each part optional): [R, d_out] in the
    dtype of `rows` [R, d_in]; [B, R, d_out] of rows [B, R, d_in] by a kernel of each
    sentence's columns ([B, d_in, d_out]: `column_tensors` of shortlists).

    Args:
      rows: [R, d_in], or [B, R, d_in].
      bias: optional [d_out].
      relu: apply max(0, .) to the result.
      column_scale: optional float32 [d_out] or scalar: a factor of each output column (the
        attention's D**-0.5 on its query columns).
      static_rows: R is fixed when XLA compiles the product (every position of a padded batch
        is a row, as in a decoding step), not a count of real tokens.
    """
    raise NotImplementedError

  def column_tensors(self, ids=None, dtype=None) -> tuple:
    """The tensors of the kernel in the compute `dtype`, or of each sentence's columns `ids`
    (int32 [B, n]: vocabulary shortlists; the kernel is then [B, d_in, n]), which a search
    computes once and keeps in its cache (tensors only: the cache goes in and out of
    tf.functions); `of_columns` makes them a Kernel again."""
    raise NotImplementedError

  def of_columns(self, tensors: tuple) -> "Kernel":
    """The Kernel of `column_tensors`' tensors."""
    raise NotImplementedError

  @property
  def shape(self) -> tf.TensorShape:
    raise NotImplementedError

  @property
  def variables(self) -> list:
    """The variables a module saving this kernel must save (none for a layer's own)."""
    return []


class Float32Kernel(Kernel):
  """The weights as trained: `values` (a variable or a tensor) cast to the rows' dtype.

  Args:
    values: [d_in, d_out]; with `transposed`, [d_out, d_in] (the embedding matrix as the
      pre-softmax projection: `columns` transposes it once for a whole search).
    fast_input_gradient: multiply with row_matmul (its input gradient is faster on CPU for a
      kernel wider than tall); else with tf.matmul.
  """

  def __init__(self, values, fast_input_gradient: bool = True, transposed: bool = False):
    self.values = values
    self.fast_input_gradient = fast_input_gradient
    self.transposed = transposed

  def matmul(self, rows, bias=None, relu=False, column_scale=None, static_rows=False):
    kernel = self.values
    if column_scale is not None:  # on the kernel: d_in x d_out products, not R x d_out
      kernel = tf.cast(kernel, tf.float32) * column_scale
    kernel = tf.cast(kernel, rows.dtype)
    bias = None if bias is None else tf.cast(bias, rows.dtype)
    if self.fast_input_gradient:
      return row_matmul(rows, kernel, bias, relu=relu)
    outputs = tf.matmul(rows, kernel)
    if bias is not None:
      outputs = tf.nn.bias_add(outputs, bias)  # as keras.layers.Dense adds it
    return tf.nn.relu(outputs) if relu else outputs

  def column_tensors(self, ids=None, dtype=None):
    values = self.values
    if ids is not None:  # [B, n] -> [B, n, d_in] (a column a row) -> [B, d_in, n]
      columns = values if self.transposed else tf.transpose(values)
      values = tf.linalg.matrix_transpose(tf.gather(columns, ids))
    elif self.transposed:
      values = tf.transpose(values)
    return (tf.cast(values, dtype or values.dtype),)

  def of_columns(self, tensors):
    return Float32Kernel(tensors[0], fast_input_gradient=False)

  @property
  def shape(self):
    shape = tf.TensorShape(self.values.shape)
    return tf.TensorShape(shape[::-1]) if self.transposed else shape


class _ReducedKernel(Kernel):
  """A copy of a float32 kernel in fewer bits, for inference: `values` and per-column `scale`
  (None: none) are tf.Variables (the module that saves it tracks them: see `convert`), or
  tensors for `of_columns`. The product is formed in float32, then cast to the rows'
  dtype."""

  def __init__(self, values, scale=None):
    self.values, self.scale = values, scale

  def column_tensors(self, ids=None, dtype=None):
    del dtype  # the product is formed in float32 whatever the rows' dtype
    tensors = (self.values,) if self.scale is None else (self.values, self.scale)
    if ids is None:
      return tuple(tf.convert_to_tensor(tensor) for tensor in tensors)
    # an int8 column keeps its scale, so a product with it equals that column of the product
    # with the whole kernel; [d_in or 1, B, n] -> [B, d_in or 1, n]
    return tuple(tf.transpose(tf.gather(tensor, ids, axis=1), [1, 0, 2]) for tensor in tensors)

  def of_columns(self, tensors):
    selected = copy.copy(self)
    selected.values = tensors[0]
    selected.scale = tensors[1] if len(tensors) > 1 else None
    return selected

  @property
  def shape(self):
    return self.values.shape

  @property
  def variables(self):
    return [self.values] + ([self.scale] if self.scale is not None else [])

  def product(self, rows, static_rows: bool):
    """float32 [..., R, d_out]: rows [..., R, d_in] @ kernel, as this precision forms it."""
    raise NotImplementedError

  def matmul(self, rows, bias=None, relu=False, column_scale=None, static_rows=False):
    outputs = self.product(tf.cast(rows, tf.float32), static_rows)
    if column_scale is not None:
      outputs *= tf.cast(column_scale, tf.float32)
    if bias is not None:
      outputs = tf.nn.bias_add(outputs, tf.cast(bias, tf.float32))
    if relu:
      outputs = tf.nn.relu(outputs)
    return tf.cast(outputs, rows.dtype)


class Bfloat16Kernel(_ReducedKernel):
  """Kernel and rows rounded to bfloat16 for the product."""

  @classmethod
  def from_matrix(cls, kernel: np.ndarray, name: str) -> "Bfloat16Kernel":
    return cls(tf.Variable(tf.cast(kernel, tf.bfloat16), trainable=False,
                           name=f"{name}_bfloat16"))

  def product(self, rows, static_rows):
    return tf.cast(tf.matmul(tf.cast(rows, tf.bfloat16), self.values), tf.float32)


class Int8Kernel(_ReducedKernel):
  """int8 columns, each with its scale; rows quantised with their own scale at each product.

  int8 error per output element: at most about (|row| max * |kernel column| max) * d_in /
  127**2 in the worst case, far less on average (rounding errors of both sides cancel).
  """

  @classmethod
  def from_matrix(cls, kernel: np.ndarray, name: str) -> "Int8Kernel":
    values, scale = keras.quantizers.abs_max_quantize(kernel, axis=0, to_numpy=True)
    # 1 / (127 / max |w|): a product rescales by multiplying, not dividing
    return cls(tf.Variable(np.asarray(values, np.int8), trainable=False, name=f"{name}_int8"),
               tf.Variable(1.0 / np.asarray(scale, np.float32), trainable=False,
                           name=f"{name}_scale"))  # [1, d_out]

  def product(self, rows, static_rows):
    """static_rows: an odd R gets a row of zeros: XLA's CPU backend multiplies 2 or more int8
    rows in int8, but one row in int32, widening the whole kernel on every call (7 ms a
    sentence at small dims, greedy)."""
    # [..., R, d_in], [..., R, 1]
    quantized, row_scale = keras.quantizers.abs_max_quantize(rows, axis=-1)
    if static_rows:
      count = tf.shape(quantized)[-2]
      padding = [[0, 0]] * (rows.shape.rank - 2) + [[0, tf.math.floormod(count, 2)], [0, 0]]
      sums = tf.linalg.matmul(tf.pad(quantized, padding), self.values,
                              output_type=tf.int32)[..., :count, :]
    else:
      sums = tf.linalg.matmul(quantized, self.values, output_type=tf.int32)
    return tf.cast(sums, tf.float32) * (self.scale / row_scale)


# The precisions an export may choose (its `precision` option), by name.
PRECISIONS = {"float32": Float32Kernel, "bfloat16": Bfloat16Kernel, "int8": Int8Kernel}


def convert(model, precision: str):
  """Gives every weight matrix of `model`'s matrix products a `precision` copy for inference.

  The attention projections and the feed-forward layers of the encoder and decoder, and the
  pre-softmax projection (a transposed copy: the embedding lookup keeps the float32 matrix).
  The model then decodes with the copies; it should not be trained any more.

  Args:
    model: a Transformer in float32 compute.
    precision: a name of PRECISIONS; "float32" changes nothing.

  Returns:
    (added, replaced): the new variables, and the float32 variables that inference no longer
    reads (a module saving the model for inference saves the first and not the second).
  """
  if precision not in PRECISIONS:
    raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
  kernel_class = PRECISIONS[precision]
  if kernel_class is Float32Kernel:  # the layers' own kernels already
    return [], []
  added, replaced = [], []
  for layer in _layers_with_kernels(model):
    for name, variable in layer.kernels_for_inference().items():
      kernel = kernel_class.from_matrix(np.asarray(variable.numpy(), np.float32),
                                        f"{layer.name}_{name}")
      layer.kernels[name] = kernel
      added += kernel.variables
      replaced.append(variable)
  embedding = model.target_embedding
  output_kernel = kernel_class.from_matrix(np.transpose(embedding.embeddings.numpy()),
                                           f"{embedding.name}_output_kernel")
  embedding.kernels["output_kernel"] = output_kernel
  added += output_kernel.variables
  return added, replaced


def _layers_with_kernels(model):
  """The MultiHeadAttention and FeedForward layers of `model`'s encoder and decoder."""
  return [getattr(layer, name) for stack in (model.encoder, model.decoder)
          for layer in stack.stack for name in ("self_attention", "cross_attention", "ffn")
          if hasattr(layer, name)]


def inference_variables(models, precision: str) -> list:
  """`convert`s each distinct model of `models` (an ensemble's members; a model listed twice
  is converted once) to `precision`, and returns what inference reads of them: the values of
  the variables that no copy replaced, then the new copies, each variable once."""
  added, replaced = [], set()
  distinct = {id(model): model for model in models}.values()
  for model in distinct:
    new, old = convert(model, precision)
    added += new
    replaced |= {variable.path for variable in old}
  variables = {id(v): v for model in distinct for v in model.variables}.values()
  return [v.value for v in variables if v.path not in replaced] + added
