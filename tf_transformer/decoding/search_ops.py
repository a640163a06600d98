"""What the searches share (beam search, sampling, constrained search): the masking value, the
GNMT length penalty, a fast top-k over vocabulary rows, prefix forcing, and the reshapes between
a beam's [B, K, ...] and its rows [B * K, ...]."""

import tensorflow as tf

from tf_transformer.layers.attention_bias import large_negative

# finite: -inf * 0 is NaN when a masked score meets a zero length penalty
NEG_INF = large_negative(tf.float32)


def length_penalty(length, alpha: float):
  """GNMT length penalty ((5 + length) / 6)^alpha (Wu et al., 2016, section 7)."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def top_k_rows(x, k: int, chunk: int = 64):
  """tf.math.top_k(x, k) of x float32 [N, V] by way of chunk maxima (V static; else top_k).

  The k largest values of a row lie in the k chunks with the largest maxima (a chunk holding
  one of them has a maximum at least as large, and fewer than k other chunks can beat it), so
  a max over chunks, a top-k over the N x V / chunk maxima and one over the k x chunk values of
  the chosen chunks replace TensorFlow's CPU top-k over all of x, several times slower.

  Returns:
    values float32 [N, k], descending, and their int32 indices into V.
  """
  rows, vocab_size = tf.shape(x)[0], x.shape[-1]
  if vocab_size is None or -(-vocab_size // chunk) <= k:
    return tf.math.top_k(x, k=k)
  chunks = -(-vocab_size // chunk)
  padded = tf.pad(x, [[0, 0], [0, chunks * chunk - vocab_size]], constant_values=-float("inf"))
  blocks = tf.reshape(padded, [rows, chunks, chunk])
  _, best_chunks = tf.math.top_k(tf.reduce_max(blocks, axis=2), k=k)  # -> [N, k]
  candidates = tf.reshape(tf.gather(blocks, best_chunks, batch_dims=1), [rows, k * chunk])
  values, positions = tf.math.top_k(candidates, k=k)  # -> [N, k]
  indices = tf.gather(best_chunks, positions // chunk, batch_dims=1) * chunk + positions % chunk
  return values, indices


def force_prefix(logits, prefix_ids, step, beam_size: int):
  """`logits` with every token but the prefix's at `step` set to a large negative, in the rows
  of the sentences whose prefix is that long; the other rows as they are.

  Args:
    logits: float32 [B * K, V].
    prefix_ids: int32 [B, P], each sentence's forced first tokens, 0-padded (P may be 0).
    step: int32 scalar.
    beam_size: K.
  """
  # a column of zeros past the end: no token is forced from step P on
  padded = tf.pad(prefix_ids, [[0, 0], [0, 1]])
  forced = padded[:, tf.minimum(step, tf.shape(prefix_ids)[1])]  # -> [B], 0: none
  forced = tf.repeat(forced, beam_size)  # -> [B * K]

  def masked():
    other = tf.not_equal(tf.range(tf.shape(logits)[-1])[tf.newaxis], forced[:, tf.newaxis])
    return tf.where((forced > 0)[:, tf.newaxis] & other, NEG_INF, logits)

  # past every prefix (or with none: the searches without one run as this one) the [B * K, V]
  # pass would change nothing
  return tf.cond(tf.reduce_any(forced > 0), masked, lambda: logits)


def flatten_beam(x):
  """[B, K, ...] -> [B * K, ...]."""
  shape = tf.shape(x)
  return tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], axis=0))


def unflatten_beam(x, batch, beam_size):
  """[B * K, ...] -> [B, K, ...]."""
  return tf.reshape(x, tf.concat([[batch, beam_size], tf.shape(x)[1:]], axis=0))


def expand_to_beam(x, beam_size):
  """[B, ...] -> [B, K, ...] by repeating each row."""
  x = tf.expand_dims(x, 1)
  multiples = tf.concat([[1, beam_size], tf.ones([tf.rank(x) - 2], tf.int32)], axis=0)
  return tf.tile(x, multiples)


def gather_beams(x, indices):
  """x [B, N, ...], indices [B, M] into axis 1 -> [B, M, ...]."""
  return tf.gather(x, indices, axis=1, batch_dims=1)
