"""In-graph batching: the requests that concurrent callers make of one signature merged into one
search by TensorFlow's BatchFunction op (config.BatchingConfig)."""

import tensorflow as tf


def batched(queue: str, batching, fn, *inputs):
  """fn(*inputs), with the inputs of concurrent calls merged when `batching` is set.

  One queue per signature: the requests that arrive while the queue's batch is open are
  concatenated (in any order, up to batching.max_batch_size rows, padded up to an allowed batch
  size with copies of a row), fn runs once over them, and each caller gets back its own rows. A
  request of no rows, or of more rows than max_batch_size, runs alone, as without batching.

  Args:
    queue: the queue's name, unique to a module and a signature: a process that loads two
      exports (two versions of a model under TF Serving) must not merge the requests of one
      into the other.
    batching: config.BatchingConfig, or None (fn runs as it is).
    fn: fn(*tensors [b] each) -> tuple of tensors [b, ...], row i of each output depending
      on row i of the inputs alone.
    inputs: tensors [B] (strings or seeds).
  """
  if batching is None:
    return fn(*inputs)
  function = tf.function(fn, autograph=False).get_concrete_function(
      *(tf.TensorSpec([None, *tensor.shape[1:]], tensor.dtype) for tensor in inputs))

  def merged():
    outputs = tf.raw_ops.BatchFunction(
        in_tensors=list(inputs), captured_tensors=function.captured_inputs, f=function,
        Tout=[output.dtype for output in function.outputs],
        num_batch_threads=batching.num_batch_threads,
        max_batch_size=batching.max_batch_size,
        batch_timeout_micros=batching.batch_timeout_micros,
        allowed_batch_sizes=list(batching.allowed_batch_sizes),
        max_enqueued_batches=batching.max_enqueued_batches,
        shared_name=queue, enable_large_batch_splitting=True)
    # the op's outputs have no static shape: give back fn's (an export's beam size is read
    # off translate_nbest's)
    return tuple(tf.ensure_shape(output, spec.shape)
                 for output, spec in zip(outputs, function.outputs))

  rows = tf.size(inputs[0])
  # (a request of no rows has nothing to merge, and BatchFunction fails on one whose outputs
  # have more than one dimension)
  return tf.cond(tf.logical_and(rows > 0, rows <= batching.max_batch_size), merged,
                 lambda: tuple(function(*inputs)))
