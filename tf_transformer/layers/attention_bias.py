"""Additive attention biases: 0 where a position may be attended, a large negative where not.

Biases are built once per batch and added to the attention logits of every layer.
"""

import tensorflow as tf

from data_pipeline.token_ids import PAD_ID


def large_negative(dtype) -> float:
  """A large negative number that stays finite in `dtype`.

  -inf is avoided because -inf * 0 is NaN (a fully masked row would poison the softmax
  gradient), and -1e9 overflows float16 (max 65504), so the value is sized to the dtype.
  """
  dtype = tf.as_dtype(dtype)
  return -1e4 if dtype == tf.float16 else -1e9


def padding_bias(ids: tf.Tensor, dtype=tf.float32) -> tf.Tensor:
  """Bias that hides padded keys.

  Args:
    ids: int32 [batch, length]; PAD_ID marks padding.
    dtype: dtype of the returned bias.

  Returns:
    [batch, 1, 1, length]: 0 at real tokens, large negative at padding.
  """
  is_pad = tf.cast(tf.equal(ids, PAD_ID), dtype)
  return (is_pad * large_negative(dtype))[:, tf.newaxis, tf.newaxis, :]


def causal_bias(length, dtype=tf.float32) -> tf.Tensor:
  """Bias that hides future positions: query i may attend to keys j <= i.

  Returns:
    [1, 1, length, length]: 0 on and below the diagonal, large negative above.
  """
  lower = tf.linalg.band_part(tf.ones([length, length], dtype), -1, 0)
  return ((1.0 - lower) * large_negative(dtype))[tf.newaxis, tf.newaxis, :, :]


def decoder_self_attention_bias(target_ids: tf.Tensor, dtype=tf.float32) -> tf.Tensor:
  """Causal and padding bias of the decoder's self-attention.

  Args:
    target_ids: int32 [batch, length] (the shifted-right decoder input).

  Returns:
    [batch, 1, length, length].
  """
  length = tf.shape(target_ids)[1]
  return tf.minimum(causal_bias(length, dtype), padding_bias(target_ids, dtype))


def cached_step_bias(buffer_length, step, dtype=tf.float32) -> tf.Tensor:
  """Bias of the decoder's self-attention at one cached decoding step.

  The key/value buffers have `buffer_length` slots; the slots after `step` are not
  written yet and must stay hidden (the causal mask of a one-token query).

  Args:
    buffer_length: int32 scalar, the buffers' length.
    step: int32 scalar, the position of the token being fed.

  Returns:
    [1, 1, 1, buffer_length]: 0 at slots <= step, large negative after.
  """
  future = tf.cast(tf.range(buffer_length) > step, dtype)
  return (future * large_negative(dtype))[tf.newaxis, tf.newaxis, tf.newaxis, :]
