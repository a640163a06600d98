"""The training loop: tf.distribute step, checkpoints and resume, evaluation, summaries."""

import dataclasses
import json
import math
import os
import shutil
import signal
import tempfile
import time

import keras
import tensorflow as tf
from absl import logging

from tf_transformer import evaluation, losses, model_dir
from tf_transformer.model import Transformer
from tf_transformer.schedule import NoamSchedule
from tf_transformer.translator import Translator, translate_texts

_LOG_EVERY = 50  # steps between progress-bar/TensorBoard updates of the training statistics


class TrainingInterrupted(RuntimeError):
  """Training stopped by a signal after saving a checkpoint."""


def set_up_runtime(train_config) -> tf.distribute.Strategy:
  """Seeds, determinism, devices and the strategy: call it before any other TensorFlow work.

  It must come first because seeding clears TensorFlow's kernel cache, which destroys
  kernel-owned resources such as tf-text's SentencePiece model, and because logical CPU
  devices and collective (multi-worker) runtimes cannot be configured once it has started.
  """
  c = train_config
  keras.utils.set_random_seed(c.seed)
  if c.deterministic:
    tf.config.experimental.enable_op_determinism()
  return _make_strategy(c.distribution, c.num_cpu_devices, c.tpu)


def _make_strategy(distribution: str, num_cpu_devices: int, tpu: str) -> tf.distribute.Strategy:
  """One device (default), MirroredStrategy over GPUs or logical CPUs, MultiWorkerMirrored
  across the hosts of TF_CONFIG, or TPUStrategy."""
  if num_cpu_devices > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_cpu_devices)
  if distribution == "mirrored":
    devices = [d.name for d in tf.config.list_logical_devices("GPU")]
    devices = devices or [d.name for d in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices)
  if distribution == "multi_worker":
    return tf.distribute.MultiWorkerMirroredStrategy()
  if distribution == "tpu":
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  return tf.distribute.get_strategy()


def worker_info(strategy) -> tuple[int, int, bool]:
  """(number of workers, this worker's index, whether it is the chief) of a strategy.

  The chief (task "chief", or worker 0 when the cluster has none) writes checkpoints and
  summaries; the other workers write theirs to throwaway folders.
  """
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.cluster_spec().as_dict():
    return 1, 0, True
  cluster = resolver.cluster_spec().as_dict()
  task_type, task_id = resolver.task_type, resolver.task_id or 0
  workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
  index = task_id + (1 if task_type == "worker" and "chief" in cluster else 0)
  is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0
                                      and "chief" not in cluster)
  return workers, index, is_chief


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


def make_optimizer(model_config, train_config) -> keras.optimizers.Optimizer:
  """Adam(0.9, 0.98, 1e-9) on the Noam schedule (section 5.3); with dynamic loss scaling
  under mixed_float16, whose gradients would otherwise underflow."""
  c = train_config
  optimizer = keras.optimizers.Adam(
      NoamSchedule(model_config.d_model, c.warmup_steps, c.learning_rate), beta_1=0.9,
      beta_2=0.98, epsilon=1e-9, global_clipnorm=c.clip_norm or None)
  if c.mixed_precision == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer


class Trainer:
  """Trains a Transformer on ParallelData under a tf.distribute strategy."""

  def __init__(self, data, model_config, train_config, decode_config,
               strategy: tf.distribute.Strategy):
    """`decode_config` gives the dev/test search (its beam size replaced by
    --eval_beam_size); `strategy` comes from `set_up_runtime`, called before `data`."""
    self.data = data
    self.model_config = model_config
    self.config = train_config
    self.strategy = strategy
    c = train_config
    num_workers, worker_index, self.is_chief = worker_info(strategy)
    # only the chief writes into model_dir; other workers save into a folder thrown away
    self._write_dir = c.model_dir if self.is_chief else tempfile.mkdtemp(prefix="worker_")
    if self.is_chief:
      model_dir.check_config(c.model_dir, model_config)
    policy = None if c.mixed_precision == "float32" else c.mixed_precision
    with self.strategy.scope():
      self.model = Transformer(**dataclasses.asdict(model_config), dtype=policy)
      self.optimizer = make_optimizer(model_config, c)
      self.optimizer.build(self.model.trainable_variables)
      self.best_bleu = tf.Variable(-1.0, trainable=False, name="best_bleu")
      self.evals_without_improvement = tf.Variable(0, trainable=False,
                                                   name="evals_without_improvement")
    self.iterator = iter(data.train_batches(c.seed, num_workers, worker_index))
    # Keras keeps dropout RNG states outside the model's weights; saving them makes a resumed
    # run draw the same dropout masks as an uninterrupted one
    weight_ids = {id(w) for w in self.model.weights}
    dropout_states = [v for v in self.model.variables if id(v) not in weight_ids]
    checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                     iterator=self.iterator, dropout_states=dropout_states,
                                     best_bleu=self.best_bleu,
                                     evals_without_improvement=self.evals_without_improvement)
    self.manager = tf.train.CheckpointManager(checkpoint, self._write_dir, c.keep_checkpoints,
                                              checkpoint_name="ckpt")
    self.best_manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=self.model), os.path.join(self._write_dir, "best"), 1,
        checkpoint_name="ckpt")
    # every worker resumes from the chief's checkpoint (model_dir is on a shared file system)
    latest = tf.train.latest_checkpoint(c.model_dir)
    if latest:
      model_dir.restore(checkpoint, latest)
      logging.info("resumed from %s at step %d", latest, self.step)
    search = dataclasses.replace(decode_config, beam_size=c.eval_beam_size, nbest=1)
    self.translator = Translator(self.model, data.vocabulary, **dataclasses.asdict(search))
    self._loss_statistics = evaluation.make_loss_statistics(self.model, c.label_smoothing)
    self._train_step = make_train_step(self.model, self.optimizer, strategy, c.label_smoothing,
                                       c.update_freq, c.jit_compile)
    self.compiled_shapes = set()  # (rows, length) of the batches the step has seen
    self._writers = {name: (tf.summary.create_file_writer(os.path.join(c.model_dir, name))
                            if self.is_chief else tf.summary.create_noop_writer())
                     for name in ("train", "eval")}

  @property
  def step(self) -> int:
    return int(self.optimizer.iterations.numpy())

  def _restore(self, manager) -> bool:
    """Restores the manager's latest checkpoint, if any; True when there was one."""
    if manager.latest_checkpoint:
      model_dir.restore(manager.checkpoint, manager.latest_checkpoint)
    return bool(manager.latest_checkpoint)

  def translate(self, texts: list[str]) -> list[str]:
    """The model's translations of `texts` with the evaluation search (--eval_beam_size)."""
    outputs, _ = translate_texts(self.translator.translate_nbest, texts,
                                 self.config.eval_batch_size)
    return [nbest[0] for nbest in outputs]

  def _summaries(self, writer, step, scalars: dict):
    with self._writers[writer].as_default(step=step):
      for name, value in scalars.items():
        tf.summary.scalar(name, value)

  def evaluate(self) -> dict:
    """Dev loss/perplexity/accuracy over the dev set, BLEU on the first --eval_sentences."""
    results = {}
    batches = self.data.dev_batches()
    if batches is not None:
      results.update(evaluation.dev_loss(self._loss_statistics, batches))
    pairs = self.data.dev_pairs(self.config.eval_sentences)
    if pairs:
      sources, references = zip(*pairs)
      hypotheses = self.translate(list(sources))
      results["bleu"] = evaluation.corpus_bleu(hypotheses, list(references))[0].score
      samples = "\n\n".join(f"**source** {s}  \n**reference** {r}  \n**output** {h}"
                            for s, r, h in list(zip(sources, references, hypotheses))[:4])
      with self._writers["eval"].as_default(step=self.step):
        tf.summary.text("translations", samples)
    return results

  def _evaluate_and_select(self) -> bool:
    """Evaluates, keeps the best checkpoint by dev BLEU; returns True to stop early."""
    step = self.step
    results = self.evaluate()
    self._summaries("eval", step, results)
    logging.info("step %d dev: %s", step, " ".join(f"{k} {v:.4g}" for k, v in results.items()))
    if "bleu" not in results:
      return False
    if results["bleu"] > float(self.best_bleu.numpy()):
      self.best_bleu.assign(results["bleu"])
      self.evals_without_improvement.assign(0)
      self.best_manager.save(checkpoint_number=step)
      logging.info("new best dev BLEU %.2f at step %d", results["bleu"], step)
    else:
      self.evals_without_improvement.assign_add(1)
    patience = self.config.early_stopping
    return bool(patience) and int(self.evals_without_improvement.numpy()) >= patience

  def train(self) -> dict:
    """Runs until --train_steps (or early stopping); returns the final dev/test results.

    Raises:
      TrainingInterrupted: SIGINT/SIGTERM arrived; a checkpoint of the last step was saved.
    """
    c = self.config
    progress = keras.utils.Progbar(c.train_steps, stateful_metrics=["loss", "acc", "lr", "tok/s"])
    stop = []
    handlers = {sig: signal.signal(sig, lambda *_: stop.append(True))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
      self._loop(progress, stop)
    finally:
      for sig, handler in handlers.items():
        signal.signal(sig, handler)
    if stop:
      self.manager.save(checkpoint_number=self.step)
      raise TrainingInterrupted(
          f"stopped at step {self.step}; checkpoint saved in {c.model_dir}; rerun the same "
          "command to resume")
    return self._finish()

  def _loop(self, progress, stop):
    c = self.config
    window = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
    window_start = time.perf_counter()
    step = self.step
    progress.update(step)
    while step < c.train_steps and not stop:
      stats = self._train_step(self.iterator)
      step += 1
      self._note_shapes(stats["shapes"].numpy())
      for key in window:
        window[key] += float(stats[key])
      if step % _LOG_EVERY == 0 or step == c.train_steps:
        elapsed = time.perf_counter() - window_start
        tokens = max(window["tokens"], 1.0)
        scalars = {"loss": window["loss"] / tokens, "accuracy": window["correct"] / tokens,
                   "perplexity": math.exp(min(window["nll"] / tokens, 50.0)),
                   "learning_rate": float(self.optimizer.learning_rate),
                   "tokens_per_sec": window["tokens"] / elapsed}
        self._summaries("train", step, scalars)
        progress.update(step, [("loss", round(scalars["loss"], 3)),
                               ("acc", round(scalars["accuracy"], 3)),
                               ("lr", float(f"{scalars['learning_rate']:.2e}")),
                               ("tok/s", round(scalars["tokens_per_sec"]))])
        window = dict.fromkeys(window, 0.0)
        window_start = time.perf_counter()
      if step % c.save_every == 0:
        self.manager.save(checkpoint_number=step)
      if step % c.eval_every == 0 or step == c.train_steps:
        if self._evaluate_and_select():
          logging.info("early stopping: no better dev BLEU in %d evaluations", c.early_stopping)
          break
        window_start = time.perf_counter()  # evaluation time is not training throughput
    if not (self.manager.latest_checkpoint or "").endswith(f"-{step}"):
      self.manager.save(checkpoint_number=step)

  def _note_shapes(self, shapes):
    """Logs each batch shape seen for the first time: under --jit_compile each one costs an
    XLA compilation, and bucketing keeps them to one per length bucket."""
    for rows, length in shapes.tolist():
      if (rows, length) not in self.compiled_shapes:
        self.compiled_shapes.add((rows, length))
        if self.config.jit_compile:
          logging.info("XLA: train step compiled for batches of [%d, %d] (%d shapes so far)",
                       rows, length, len(self.compiled_shapes))

  def _finish(self) -> dict:
    """Scores the best checkpoint (by dev BLEU) on the test set, if there is one."""
    results = {"step": self.step, "best_dev_bleu": float(self.best_bleu.numpy())}
    test = self.data.test_pairs()
    if test:
      if self.best_manager.latest_checkpoint:
        self._restore(self.best_manager)
      sources, references = zip(*test)
      hypotheses = self.translate(list(sources))
      bleu, signature = evaluation.corpus_bleu(hypotheses, list(references))
      results.update(test_bleu=bleu.score, test_bleu_text=str(bleu), bleu_signature=signature,
                     test_beam_size=self.config.eval_beam_size)
      path = os.path.join(self._write_dir, "test_hypotheses.txt")
      with open(path, "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in hypotheses)
      logging.info("test: %s (%s); hypotheses in %s", bleu, results["bleu_signature"], path)
    if self.is_chief:
      with open(os.path.join(self.config.model_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    else:
      shutil.rmtree(self._write_dir, ignore_errors=True)
    return results
