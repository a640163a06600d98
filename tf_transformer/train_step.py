"""The compiled training step: gradients on every replica, accumulation, one optimizer update."""

import keras
import tensorflow as tf

from tf_transformer import losses
from tf_transformer.runtime import worker_info


def _replica_slice(batch, local_replicas: int):
  """This replica's rows of its worker's batch [B, ...]: B * r // n up to B * (r + 1) // n,
  r being the replica's index among the worker's n local replicas.

  Every replica of a worker reads the same batch and takes its share, so the data iterator
  stays a plain (checkpointable) tf.data iterator and a step sees the same examples on any
  number of replicas; a replica whose share is empty contributes zero tokens, not NaN.
  """
  context = tf.distribute.get_replica_context()
  replica = context.replica_id_in_sync_group % local_replicas
  size = tf.shape(batch[0])[0]
  start, end = size * replica // local_replicas, size * (replica + 1) // local_replicas
  return [tensor[start:end] for tensor in batch]


def _scaled(gradient, scale):
  """gradient * scale, keeping an embedding's IndexedSlices sparse."""
  if isinstance(gradient, tf.IndexedSlices):
    return tf.IndexedSlices(gradient.values * tf.cast(scale, gradient.values.dtype),
                            gradient.indices, gradient.dense_shape)
  return gradient * tf.cast(scale, gradient.dtype)


def make_train_step(model, optimizer, strategy, label_smoothing: float, update_freq: int = 1,
                    jit_compile: bool = False):
  """The compiled training step: `update_freq` batches per worker, one optimizer update.

  The gradient is that of the summed loss of the step's batches on every replica, divided by
  the number of target tokens of the whole step (all-reduced), so it does not depend on how
  the tokens are split over replicas or micro-batches. With `jit_compile`, each replica's
  forward and backward pass is XLA-compiled (one compilation per batch shape).

  Returns:
    fn(iterator) -> dict of float32 scalars summed over replicas and batches: "loss"
    (label-smoothed), "nll", "correct" and "tokens" (real target tokens of the step), and
    "shapes": int32 [update_freq, 2], the (rows, length) of each batch read. `iterator`
    yields (source_ids, target_input_ids, target_ids) int32 [batch, length].
  """
  variables = model.trainable_variables
  local_replicas = strategy.num_replicas_in_sync // worker_info(strategy)[0]
  static_shapes = jit_compile or isinstance(strategy, tf.distribute.TPUStrategy)
  scales_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

  def gradients_of(*batch):
    with tf.GradientTape() as tape:
      stats = losses.batch_statistics(model, batch, label_smoothing, static_shapes)
      loss = optimizer.scale_loss(stats["loss"]) if scales_loss else stats["loss"]
    return tape.gradient(loss, variables), stats

  if jit_compile:
    gradients_of = tf.function(gradients_of, jit_compile=True)

  def apply(gradients, local_tokens):
    tokens = tf.distribute.get_replica_context().all_reduce("sum", local_tokens)
    scale = 1.0 / tf.maximum(tokens, 1.0)
    optimizer.apply_gradients([(_scaled(g, scale), v) for g, v in zip(gradients, variables)])

  def shape_of(batch):
    return tf.stack([tf.shape(batch[0])[0], tf.shape(batch[0])[1]])

  if update_freq == 1:
    def replica_step(*batch):
      gradients, stats = gradients_of(*_replica_slice(batch, local_replicas))
      apply(gradients, stats["tokens"])
      return stats

    @tf.function
    def train_step(iterator):
      batch = next(iterator)
      stats = strategy.run(replica_step, args=batch)
      stats = {key: strategy.reduce("sum", value, axis=None) for key, value in stats.items()}
      return dict(stats, shapes=shape_of(batch)[tf.newaxis])

    return train_step

  with strategy.scope():
    sums = [tf.Variable(tf.zeros_like(v), trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM) for v in variables]
    local_tokens = tf.Variable(0.0, trainable=False,
                               synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.SUM)

  def replica_accumulate(*batch):
    gradients, stats = gradients_of(*_replica_slice(batch, local_replicas))
    for total, gradient in zip(sums, gradients):
      total.assign_add(tf.convert_to_tensor(gradient))
    local_tokens.assign_add(stats["tokens"])
    return stats

  def replica_apply():
    apply([total.read_value() for total in sums], local_tokens.read_value())
    for total in sums:
      total.assign(tf.zeros_like(total))
    local_tokens.assign(0.0)

  @tf.function
  def train_step(iterator):
    totals = dict.fromkeys(("loss", "nll", "correct", "tokens"), tf.constant(0.0))
    shapes = tf.TensorArray(tf.int32, size=update_freq)
    for i in tf.range(update_freq):
      batch = next(iterator)
      stats = strategy.run(replica_accumulate, args=batch)
      totals = {key: totals[key] + strategy.reduce("sum", stats[key], axis=None)
                for key in totals}
      shapes = shapes.write(i, shape_of(batch))
    strategy.run(replica_apply)
    return dict(totals, shapes=shapes.stack())

  return train_step
