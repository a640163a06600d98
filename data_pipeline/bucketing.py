"""Length buckets with token-based batch sizes, as `Dataset -> Dataset` transformations.

    lengths:   1 ........ 8 | 9 ... 12 | 13 ... 16 | ... | ... max_length + 1
    bucket:         0       |    1     |     2     | ... |    last
    padded to:      8       |   12     |    16     | ... | its boundary
    batch:   batch_tokens // boundary examples

Every batch is padded to its bucket's boundary (not to its longest example), so a training
run sees at most one [batch, length] shape per bucket and a compiled step never retraces.
"""

import math

import tensorflow as tf


def bucket_boundaries(max_length: int, min_boundary: int = 8, growth: float = 0.1) -> list[int]:
  """Increasing boundaries from `min_boundary` up to the first one >= max_length.

  Each boundary is the largest length its bucket holds. Steps grow by ~`growth` of the
  boundary, rounded up to a multiple of 4, so padding stays under ~10% of a long sentence
  while short sentences get fine-grained buckets.
  """
  boundaries = [min(min_boundary, max_length)]
  while boundaries[-1] < max_length:
    step = 4 * max(1, math.ceil(boundaries[-1] * growth / 4))
    boundaries.append(min(boundaries[-1] + step, max_length))
  return boundaries


def bucket_batch_sizes(boundaries: list[int], batch_tokens: int) -> list[int]:
  """Examples per batch of each bucket: batch_tokens // boundary (at least 1)."""
  return [max(1, batch_tokens // boundary) for boundary in boundaries]


def bucket_by_length(width: int, batch_tokens: int):
  """Groups (source_ids [width], target_ids [width], length []) pairs into batches cut to
  their bucket's boundary.

  Args:
    width: the rows' width, and the longest `length` any example has (longer ones must be
      filtered before); rows are PAD_ID-padded from `length` on.
    batch_tokens: upper bound of batch * padded length, per side.

  Returns:
    A function Dataset -> Dataset of (source_ids [batch, L], target_ids [batch, L]) int32,
    PAD_ID-padded, with L the bucket boundary.
  """
  boundaries = bucket_boundaries(width)
  sizes = bucket_batch_sizes(boundaries, batch_tokens)
  boundaries_t = tf.constant(boundaries, tf.int32)
  sizes_t = tf.constant(sizes, tf.int64)

  def key(source_ids, target_ids, length):
    return tf.cast(tf.searchsorted(boundaries_t, [length], side="left")[0], tf.int64)

  def batch_bucket(bucket, window):
    length = boundaries_t[bucket]
    return window.batch(sizes_t[bucket]).map(
        lambda source, target, _: (source[:, :length], target[:, :length]))

  def apply(dataset):
    return dataset.group_by_window(key, batch_bucket,
                                   window_size_func=lambda bucket: sizes_t[bucket])

  return apply
