"""The compiled training step: gradients on every replica, accumulation, one optimizer update."""

import keras
import tensorflow as tf

from data_pipeline.token_ids import PAD_ID
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


def _global_norm(gradients):
  """float32 scalar: the L2 norm of all `gradients` together. An IndexedSlices gradient (an
  embedding's) repeats an index once per occurrence of its token: its rows are summed first."""
  half_squares = []
  for gradient in gradients:
    if isinstance(gradient, tf.IndexedSlices):
      unique, positions = tf.unique(gradient.indices)
      gradient = tf.math.unsorted_segment_sum(gradient.values, positions, tf.size(unique))
    half_squares.append(tf.nn.l2_loss(tf.cast(gradient, tf.float32)))  # one pass: sum(g**2) / 2
  return tf.sqrt(2.0 * tf.add_n(half_squares))


def _target_tokens(batch):
  """float32: the real target tokens of (source_ids, target_input_ids, target_ids), the
  count `losses.batch_statistics` reports as "tokens"."""
  return tf.reduce_sum(tf.cast(tf.not_equal(batch[1], PAD_ID), tf.float32))


def all_finite(variables) -> bool:
  """Whether no floating-point variable of `variables` holds a NaN or Inf."""
  return all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in variables
             if tf.as_dtype(v.dtype).is_floating)


def make_train_step(model, optimizer, strategy, label_smoothing: float, update_freq: int = 1,
                    jit_compile: bool = False, clip_norm: float = 0.0):
  """The compiled training step: `update_freq` batches per worker, one optimizer update.

  The gradient is that of the summed loss of the step's batches on every replica, divided by
  the number of target tokens of the whole step (all-reduced), so it does not depend on how
  the tokens are split over replicas or micro-batches. With `clip_norm`, that gradient (the
  sum over replicas, not each replica's part) is scaled down to this global norm when it is
  longer. With `jit_compile`, each replica's forward and backward pass is XLA-compiled (one
  compilation per batch shape).

  A step whose loss or gradient holds a NaN or Inf applies no update: the weights, the
  optimizer's moments and its step count stay as they were. (Under mixed_float16 the
  loss-scale optimizer also skips overflowing scaled gradients, which it expects while it finds
  its scale; then only the loss decides here.)

  Args:
    optimizer: from optimizer.make_optimizer: it takes gradients already summed over replicas.

  Returns:
    fn(iterator) -> dict of float32 scalars summed over replicas and batches: "loss"
    (label-smoothed), "nll", "correct" and "tokens" (real target tokens of the step);
    "finite", 1.0 if the update was applied, 0.0 if it was not finite and skipped;
    "grad_norm", the global norm of the step's gradient before clipping; "clipped", 1.0 if
    clipping shortened it; and "shapes": int32 [update_freq, 2], the (rows, length) of each
    batch read. `iterator` yields (source_ids, target_input_ids, target_ids) int32
    [batch, length].
  """
  variables = model.trainable_variables
  local_replicas = strategy.num_replicas_in_sync // worker_info(strategy)[0]
  scales_loss = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

  def gradients_of(batch, loss_weight=1.0):
    """The gradients of loss_weight * the batch's summed loss, and its statistics."""
    with tf.GradientTape() as tape:
      stats = losses.batch_statistics(model, batch, label_smoothing)
      loss = stats["loss"] * loss_weight
      loss = optimizer.scale_loss(loss) if scales_loss else loss
    return tape.gradient(loss, variables), stats

  if jit_compile:
    gradients_of = tf.function(gradients_of, jit_compile=True)

  def inverse_step_tokens(local_tokens):
    """Replica fn: 1 / the step's target tokens (all replicas'), given this replica's."""
    tokens = tf.distribute.get_replica_context().all_reduce("sum", local_tokens)
    return 1.0 / tf.maximum(tokens, 1.0)

  def step_gradient(gradients):
    """Replica fn: the step's gradient from every replica's part (each already divided by the
    step's tokens), clipped, with its norm before clipping and whether clipping fired; the
    same on every replica."""
    gradients = tf.distribute.get_replica_context().all_reduce("sum", gradients)
    norm = _global_norm(gradients)
    if scales_loss:
      norm /= tf.cast(optimizer.dynamic_scale, tf.float32)
    clipped = tf.constant(0.0)
    if clip_norm > 0:
      clipped = tf.cast(norm > clip_norm, tf.float32)
      factor = tf.where(norm > clip_norm, clip_norm / norm, 1.0)
      gradients = [_scaled(g, factor) for g in gradients]
    return gradients, norm, clipped

  def apply(gradients):
    optimizer.apply_gradients(zip(gradients, variables))

  def update(gradients, loss):
    """Applies the (per-replica, all-equal) step gradient unless it or the loss is not finite:
    every replica takes the same branch. Returns the "finite" statistic."""
    gradients, norm, clipped = gradients
    norm = strategy.reduce("mean", norm, axis=None)
    finite = tf.math.is_finite(loss) if scales_loss else (
        tf.math.is_finite(loss) & tf.math.is_finite(norm))
    if finite:
      strategy.run(apply, args=(gradients,))
    return {"finite": tf.cast(finite, tf.float32), "grad_norm": norm,
            "clipped": strategy.reduce("mean", clipped, axis=None)}

  def shape_of(batch):
    return tf.stack([tf.shape(batch[0])[0], tf.shape(batch[0])[1]])

  if update_freq == 1:
    def replica_gradient(*batch):
      batch = _replica_slice(batch, local_replicas)
      # the step's tokens are known before its forward pass: weighting the loss by their
      # inverse scales the gradient for free, instead of a pass over every gradient after
      gradients, stats = gradients_of(batch, inverse_step_tokens(_target_tokens(batch)))
      return step_gradient(gradients), stats

    @tf.function
    def train_step(iterator):
      batch = next(iterator)
      gradient, stats = strategy.run(replica_gradient, args=batch)
      stats = {key: strategy.reduce("sum", value, axis=None) for key, value in stats.items()}
      return dict(stats, **update(gradient, stats["loss"]), shapes=shape_of(batch)[tf.newaxis])

    return train_step

  with strategy.scope():
    sums = [tf.Variable(tf.zeros_like(v), trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM) for v in variables]
    local_tokens = tf.Variable(0.0, trainable=False,
                               synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.SUM)

  def replica_accumulate(*batch):
    gradients, stats = gradients_of(_replica_slice(batch, local_replicas))
    for total, gradient in zip(sums, gradients):
      total.assign_add(tf.convert_to_tensor(gradient))
    local_tokens.assign_add(stats["tokens"])
    return stats

  def replica_sum_gradient():
    # the step's tokens are known only after its last batch: its sums are scaled here
    scale = inverse_step_tokens(local_tokens.read_value())
    return step_gradient([_scaled(total.read_value(), scale) for total in sums])

  def replica_reset():
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
    results = update(strategy.run(replica_sum_gradient), totals["loss"])
    strategy.run(replica_reset)
    return dict(totals, **results, shapes=shapes.stack())

  return train_step
