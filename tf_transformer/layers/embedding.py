"""Token embeddings shared with the pre-softmax projection, and sinusoidal positions."""

import math

import keras
import tensorflow as tf

from data_pipeline.token_ids import PAD_ID
from tf_transformer.layers.precisions import Float32Kernel


# Where the sines and cosines of positional_encoding go.
SINUSOID_LAYOUTS = ("interleaved", "halves")


def positional_encoding(positions: tf.Tensor, d_model: int, dtype=tf.float32,
                        layout: str = "interleaved") -> tf.Tensor:
  """Sinusoidal encoding of "Attention Is All You Need", section 3.5.

  "interleaved" (the paper's formula): PE[pos, 2i] = sin(pos / 10000^(2i/d_model)),
  PE[pos, 2i+1] = cos(same angle), each (even, odd) pair of dimensions sharing one frequency.
  "halves" (Marian's, fairseq's): the same sines in dimensions 0..d_model/2 - 1 and the
  cosines after them, PE[pos, i] = sin(angle i), PE[pos, d_model/2 + i] = cos(angle i).

  Args:
    positions: int or float [length] (or any shape [...]).
    d_model: even model width.
    layout: one of SINUSOID_LAYOUTS.

  Returns:
    dtype [..., d_model].
  """
  if layout not in SINUSOID_LAYOUTS:
    raise ValueError(f"layout must be one of {SINUSOID_LAYOUTS}, got {layout!r}")
  if d_model % 2:
    raise ValueError(f"d_model must be even for sinusoidal positions, got {d_model}")
  half = d_model // 2
  inv_freq = tf.exp(tf.range(half, dtype=tf.float32) * (-2.0 * math.log(10000.0) / d_model))
  angles = tf.cast(positions, tf.float32)[..., tf.newaxis] * inv_freq  # -> [..., half]
  if layout == "halves":
    return tf.cast(tf.concat([tf.sin(angles), tf.cos(angles)], axis=-1), dtype)
  # stack then flatten the last two axes to interleave: sin, cos, sin, cos, ...
  encoding = tf.stack([tf.sin(angles), tf.cos(angles)], axis=-1)  # -> [..., half, 2]
  encoding = tf.reshape(encoding, tf.concat([tf.shape(angles)[:-1], [d_model]], axis=0))
  return tf.cast(encoding, dtype)


def add_biases(first, second):
  """The sum of two optional logit biases (None: none)."""
  if first is None or second is None:
    return second if first is None else first
  return first + second


@keras.saving.register_keras_serializable(package="tf_transformer")
class SharedEmbedding(keras.layers.Layer):
  """One [vocab_size, d_model] matrix that embeds tokens and projects to vocabulary logits.

  Section 3.4: the same weights serve the embedding layers and the pre-softmax linear
  transformation; embeddings are multiplied by sqrt(d_model). The scale exists because the
  weights are initialised with stddev d_model^-0.5 (right for the logits), so scaled embeddings
  have unit variance, the same order as the positional encoding they are added to.

  Options for other toolkits' models: `scale` off (no sqrt(d_model)), the positions'
  `sinusoid_layout` (SINUSOID_LAYOUTS), and `output_bias`, a learned [vocab_size] bias of the
  logits (Marian's final_logits_bias).
  """

  def __init__(self, vocab_size: int, d_model: int, scale: bool = True,
               sinusoid_layout: str = "interleaved", output_bias: bool = False, **kwargs):
    super().__init__(**kwargs)
    self.vocab_size = vocab_size
    self.d_model = d_model
    self.scale = scale
    self.sinusoid_layout = sinusoid_layout
    self.use_output_bias = output_bias
    # {"output_kernel": precisions.Kernel}: the pre-softmax projection's weights
    # (precisions.convert replaces it with a reduced-precision copy for inference)
    self.kernels = {}

  def build(self, input_shape=None):
    self.embeddings = self.add_weight(
        name="embeddings",
        shape=(self.vocab_size, self.d_model),
        initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
    )
    self.kernels = {"output_kernel": Float32Kernel(self.embeddings, transposed=True)}
    if self.use_output_bias:
      self.output_bias = self.add_weight(name="output_bias", shape=(self.vocab_size,),
                                         initializer="zeros")

  def call(self, ids):
    """Embeds token ids with positions.

    Args:
      ids: int32 [batch, length]; PAD_ID marks padding.

    Returns:
      [batch, length, d_model]: sqrt(d_model)-scaled (with `scale`) embedding plus positional
      encoding; zeros at padded positions.
    """
    return self.embed(ids, tf.range(tf.shape(ids)[1]))

  def embed(self, ids, positions):
    """Embeds `ids` int [...] at `positions` (broadcastable to ids; None: no positional
    encoding, for a model of relative positions) -> [..., d_model]."""
    x = tf.gather(tf.cast(self.embeddings, self.compute_dtype), ids)
    if self.scale:
      x = x * tf.cast(self.d_model**0.5, self.compute_dtype)
    if positions is not None:
      x += positional_encoding(positions, self.d_model, self.compute_dtype,
                               self.sinusoid_layout)
    not_pad = tf.cast(tf.not_equal(ids, PAD_ID), self.compute_dtype)
    return x * not_pad[..., tf.newaxis]

  def output_kernel(self, ids=None):
    """The tensors of the pre-softmax projection [d_model, vocab_size] (the transposed
    embedding matrix in the compute dtype, or its copy of precisions.convert), or of each
    sentence's columns [B, d_model, n] of its token ids `ids` (int32 [B, n]: vocabulary
    shortlists): a tuple (precisions.Kernel.column_tensors), the first of them the matrix.

    A matmul with the transposed matrix runs about twice as fast on CPU as one with
    `transpose_b=True` on the [vocab_size, d_model] matrix, so a decoding loop computes it once
    and passes it to `logits`.
    """
    return self.kernels["output_kernel"].column_tensors(ids, self.compute_dtype)

  def output_bias_columns(self, ids=None):
    """The learned output bias (with `output_bias`): float32 [vocab_size], or each sentence's
    [B, n] of its token ids `ids` (int32 [B, n], as `output_kernel`); None without one."""
    if not self.use_output_bias:
      return None
    bias = tf.convert_to_tensor(self.output_bias)
    return bias if ids is None else tf.gather(bias, ids)

  def logits(self, hidden, output_kernel=None, bias=None):
    """Pre-softmax projection with the transposed embedding matrix.

    Args:
      hidden: [..., d_model]; with a kernel of B sentences' columns, [B * K, ..., d_model]
        (the first K rows are sentence 0's, and so on).
      output_kernel: `output_kernel()`, if already computed; `output_kernel(ids)` gives the
        logits of each sentence's n ids only. Without it the learned output bias (if any) is
        added; with it, the caller adds `output_bias_columns` of the same ids to `bias`.
      bias: optional float32 [vocab_size] (or [B, n] with B sentences' columns) added to the
        logits (in float32 compute).

    Returns:
      float32 [..., vocab_size] (or [..., n]; float32 so softmax and loss stay stable in mixed
      precision).
    """
    if output_kernel is None:
      output_kernel = self.output_kernel()
      bias = add_biases(bias, self.output_bias_columns())
    kernel = self.kernels["output_kernel"].of_columns(output_kernel)
    rows = tf.reshape(hidden, [-1, self.d_model])  # every position is a row
    per_sentence = kernel.shape.rank == 3
    if per_sentence:  # [B * K, d] -> [B, K, d], by each sentence's own columns
      rows = tf.reshape(rows, [tf.shape(output_kernel[0])[0], -1, self.d_model])
    logits = tf.cast(kernel.matmul(rows, static_rows=True), tf.float32)
    if bias is not None and per_sentence:
      logits += bias[:, tf.newaxis]
    elif bias is not None:
      logits = tf.nn.bias_add(logits, bias)
    width = kernel.shape[-1]  # vocab_size, or a shortlist's size
    if width is None:
      width = tf.shape(logits)[-1]
    shape = tf.concat([tf.shape(hidden)[:-1], [width]], axis=0)
    return tf.reshape(logits, shape)

  def compute_output_shape(self, input_shape):
    return tuple(input_shape) + (self.d_model,)

  def get_config(self):
    config = super().get_config()
    config.update(vocab_size=self.vocab_size, d_model=self.d_model, scale=self.scale,
                  sinusoid_layout=self.sinusoid_layout, output_bias=self.use_output_bias)
    return config
