"""The compiled training step: gradients on every replica, accumulation, one optimizer update."""

import keras
import tensorflow as tf

from data_pipeline.token_ids import PAD_ID
from tf_transformer.training import losses
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


def _batch_shape(batch):
  """int32 [2]: the (rows, length) of a batch of int32 [rows, length] tensors."""
  return tf.stack([tf.shape(batch[0])[0], tf.shape(batch[0])[1]])


def _scales_loss(optimizer) -> bool:
  """Whether `optimizer` scales the loss (mixed_float16) and unscales the gradients itself."""
  return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def _gradients_fn(model, optimizer, variables, label_smoothing: float, jit_compile: bool,
                  rdrop_alpha: float = 0.0):
  """The replica's forward and backward pass over one batch, XLA-compiled with `jit_compile`
  (R-Drop's two passes with `rdrop_alpha` > 0, `losses.batch_statistics`).

  Returns:
    fn(batch, loss_weight=1.0) -> (gradients, stats). `batch`: (source_ids, target_input_ids,
    target_ids) int32 [rows, length]; `loss_weight`: float32 scalar. `gradients`: for each of
    `variables`, shaped as it (an embedding's may be IndexedSlices), the gradient of
    loss_weight * the batch's summed loss (times the loss scale, if the optimizer has one).
    `stats`: dict of float32 scalars from `losses.batch_statistics`, unweighted.
  """
  scales_loss = _scales_loss(optimizer)

  def gradients_of(batch, loss_weight=1.0):
    """The gradients of loss_weight * the batch's summed loss, and its statistics."""
    with tf.GradientTape() as tape:
      stats = losses.batch_statistics(model, batch, label_smoothing, rdrop_alpha=rdrop_alpha)
      loss = stats["loss"] * loss_weight
      loss = optimizer.scale_loss(loss) if scales_loss else loss
    return tape.gradient(loss, variables), stats

  # no AutoGraph inside: the model is plain TensorFlow ops, and converting its code (hundreds
  # of functions) took a third of a small run's start-up
  if jit_compile:
    return tf.function(gradients_of, jit_compile=True, autograph=False)
  return tf.autograph.experimental.do_not_convert(gradients_of)


def _inverse_step_tokens(local_tokens):
  """Replica fn: float32 scalar 1 / the step's target tokens (all replicas'), from this
  replica's count `local_tokens` (float32 scalar); 1 when the step has none."""
  tokens = tf.distribute.get_replica_context().all_reduce("sum", local_tokens)
  return 1.0 / tf.maximum(tokens, 1.0)


def _step_gradient(gradients, optimizer, clip_norm: float):
  """Replica fn: the step's gradient from every replica's part, the same on every replica.

  Args:
    gradients: this replica's part, one tensor (or IndexedSlices) per variable, already
      divided by the step's tokens (and loss-scaled if the optimizer scales the loss).
    optimizer: its dynamic scale, if it has one, unscales the norm.
    clip_norm: the global norm the sum is scaled down to when it is longer; 0: no clipping.

  Returns:
    gradients: the sum over replicas, clipped, one per variable as given; norm: float32
    scalar, its (unscaled) global norm before clipping; clipped: float32 scalar, 1.0 if
    clipping shortened it, else 0.0.
  """
  gradients = tf.distribute.get_replica_context().all_reduce("sum", gradients)
  norm = _global_norm(gradients)
  if _scales_loss(optimizer):
    norm /= tf.cast(optimizer.dynamic_scale, tf.float32)
  clipped = tf.constant(0.0)
  if clip_norm > 0:
    clipped = tf.cast(norm > clip_norm, tf.float32)
    factor = tf.where(norm > clip_norm, clip_norm / norm, 1.0)
    gradients = [_scaled(g, factor) for g in gradients]
  return gradients, norm, clipped


def _apply_if_finite(strategy, optimizer, variables, step_gradient, loss):
  """Cross-replica: applies the step gradient unless it or the loss is not finite.

  Every replica takes the same branch: the gradient and its norm are the same on all of them.

  Args:
    step_gradient: per-replica (gradients, norm, clipped), from `_step_gradient`.
    loss: float32 scalar, the step's summed loss over replicas.

  Returns:
    dict of float32 scalars: "finite", 1.0 if the update was applied, else 0.0; "grad_norm",
    the norm before clipping; "clipped", 1.0 if clipping fired.
  """
  gradients, norm, clipped = step_gradient
  norm = strategy.reduce("mean", norm, axis=None)
  finite = tf.math.is_finite(loss) if _scales_loss(optimizer) else (
      tf.math.is_finite(loss) & tf.math.is_finite(norm))

  def apply(gradients):
    optimizer.apply_gradients(zip(gradients, variables))

  if finite:
    strategy.run(apply, args=(gradients,))
  return {"finite": tf.cast(finite, tf.float32), "grad_norm": norm,
          "clipped": strategy.reduce("mean", clipped, axis=None)}


def _single_batch_step(strategy, optimizer, variables, gradients_of, local_replicas: int,
                       clip_norm: float):
  """The compiled step of one batch per worker (`update_freq` 1).

  Args:
    gradients_of: from `_gradients_fn`.
    local_replicas: the replicas of this worker, which share its batch.

  Returns:
    The `make_train_step` fn(iterator) -> dict of float32 scalars, "shapes" int32 [1, 2]. Each
    replica computes the gradient of its rows of the batch (int32 [rows, length] each).
  """

  def replica_gradient(*batch):
    batch = _replica_slice(batch, local_replicas)
    # the step's tokens are known before its forward pass: weighting the loss by their
    # inverse scales the gradient for free, instead of a pass over every gradient after
    weight = _inverse_step_tokens(_target_tokens(batch))
    gradients, stats = gradients_of(batch, weight)
    return _step_gradient(gradients, optimizer, clip_norm), stats

  @tf.function
  def train_step(iterator):
    batch = next(iterator)
    gradient, stats = strategy.run(replica_gradient, args=batch)
    stats = {key: strategy.reduce("sum", value, axis=None) for key, value in stats.items()}
    update = _apply_if_finite(strategy, optimizer, variables, gradient, stats["loss"])
    return dict(stats, **update, shapes=_batch_shape(batch)[tf.newaxis])

  return train_step


def _accumulators(strategy, variables):
  """Zeroed ON_READ variables, one value per replica: the sums of the replica's gradients,
  shaped as `variables` (dense), and of its target tokens (a float32 scalar)."""
  with strategy.scope():
    sums = [tf.Variable(tf.zeros_like(v), trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM) for v in variables]
    local_tokens = tf.Variable(0.0, trainable=False,
                               synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.SUM)
  return sums, local_tokens


def _accumulating_step(strategy, optimizer, variables, gradients_of, local_replicas: int,
                       clip_norm: float, update_freq: int, statistics: tuple):
  """The compiled step of `update_freq` > 1 batches per worker, one update.

  Each replica sums its gradients (dense, shaped as `variables`) and its target tokens (a
  float32 scalar) over the batches, and scales the sums once the step's tokens are known.

  Args:
    gradients_of: from `_gradients_fn`.
    local_replicas: the replicas of this worker, which share its batches.
    statistics: the names of the statistics `gradients_of` returns.

  Returns:
    The `make_train_step` fn(iterator) -> dict of float32 scalars, "shapes" int32
    [update_freq, 2].
  """
  sums, local_tokens = _accumulators(strategy, variables)

  def replica_accumulate(*batch):
    gradients, stats = gradients_of(_replica_slice(batch, local_replicas))
    for total, gradient in zip(sums, gradients):
      total.assign_add(tf.convert_to_tensor(gradient))
    local_tokens.assign_add(stats["tokens"])
    return stats

  def replica_sum_gradient():
    # the step's tokens are known only after its last batch: its sums are scaled here
    scale = _inverse_step_tokens(local_tokens.read_value())
    return _step_gradient([_scaled(total.read_value(), scale) for total in sums], optimizer,
                          clip_norm)

  def replica_reset():
    for total in sums:
      total.assign(tf.zeros_like(total))
    local_tokens.assign(0.0)

  @tf.function
  def train_step(iterator):
    totals = dict.fromkeys(statistics, tf.constant(0.0))
    shapes = tf.TensorArray(tf.int32, size=update_freq)
    for i in tf.range(update_freq):
      batch = next(iterator)
      stats = strategy.run(replica_accumulate, args=batch)
      totals = {key: totals[key] + strategy.reduce("sum", stats[key], axis=None)
                for key in totals}
      shapes = shapes.write(i, _batch_shape(batch))
    gradient = strategy.run(replica_sum_gradient)
    update = _apply_if_finite(strategy, optimizer, variables, gradient, totals["loss"])
    strategy.run(replica_reset)
    return dict(totals, **update, shapes=shapes.stack())

  return train_step


def make_train_step(model, optimizer, strategy, label_smoothing: float, update_freq: int = 1,
                    jit_compile: bool = False, clip_norm: float = 0.0, rdrop_alpha: float = 0.0):
  """The compiled training step: `update_freq` batches per worker, one optimizer update.

  The gradient is that of the summed loss of the step's batches on every replica, divided by
  the number of target tokens of the whole step (all-reduced), so it does not depend on how
  the tokens are split over replicas or micro-batches. With `clip_norm`, that gradient (the
  sum over replicas, not each replica's part) is scaled down to this global norm when it is
  longer. With `jit_compile`, each replica's forward and backward pass is XLA-compiled (one
  compilation per batch shape). With `rdrop_alpha` > 0 the loss is R-Drop's
  (`losses.batch_statistics`): each batch passes twice, under dropout masks of its own.

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
    clipping shortened it; "rdrop_kl" with R-Drop, the summed symmetric KL divergence of the
    two passes; and "shapes": int32 [update_freq, 2], the (rows, length) of each batch read.
    `iterator` yields (source_ids, target_input_ids, target_ids) int32 [batch, length].
  """
  variables = model.trainable_variables
  local_replicas = strategy.num_replicas_in_sync // worker_info(strategy)[0]
  gradients_of = _gradients_fn(model, optimizer, variables, label_smoothing, jit_compile,
                               rdrop_alpha)
  if update_freq == 1:
    return _single_batch_step(strategy, optimizer, variables, gradients_of, local_replicas,
                              clip_norm)
  statistics = ("loss", "nll", "correct", "tokens") + (("rdrop_kl",) if rdrop_alpha > 0 else ())
  return _accumulating_step(strategy, optimizer, variables, gradients_of, local_replicas,
                            clip_norm, update_freq, statistics)
