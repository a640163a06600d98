"""A request of any size in bounded memory: a function over its rows, a chunk at a time."""

import tensorflow as tf


def in_chunks(chunk_rows: int, fn, outputs, *inputs):
  """fn over rows [i, i + chunk_rows) of `inputs` (tensors [B, ...] each), concatenated.

  Args:
    chunk_rows: the rows of a chunk (the Translator's max_batch_size).
    fn: fn(*inputs of [rows, ...]) -> tuple of tensors [rows, ...].
    outputs: (trailing shape, dtype) of each tensor fn returns; a dimension is an int, or an
      int32 scalar tensor that is the same for every chunk.

  Returns:
    A tuple of tensors [B, ...], one per output.
  """
  count = tf.shape(inputs[0])[0]
  arrays = tuple(tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False,
                                element_shape=tf.TensorShape(
                                    [None] + [d if isinstance(d, int) else None
                                              for d in shape]))
                 for shape, dtype in outputs)
  chunks = (count + chunk_rows - 1) // chunk_rows

  def write_chunk(index, arrays):
    start = index * chunk_rows
    results = fn(*(tensor[start:start + chunk_rows] for tensor in inputs))
    return index + 1, tuple(array.write(index, result)
                            for array, result in zip(arrays, results))

  _, arrays = tf.while_loop(lambda index, _: index < chunks, write_chunk, (0, arrays))
  # (concat fails on an empty array whose element shape is not fully known)
  return tuple(tf.cond(count > 0, array.concat, lambda s=shape, d=dtype: tf.zeros([0, *s], d))
               for array, (shape, dtype) in zip(arrays, outputs))
