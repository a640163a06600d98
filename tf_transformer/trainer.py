"""The training loop: tf.distribute step, checkpoints and resume, evaluation, summaries."""

import dataclasses
import json
import math
import os
import signal
import time

import keras
import tensorflow as tf
from absl import logging

from tf_transformer import evaluation, losses, model_dir
from tf_transformer.layers.attention_bias import PAD_ID
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
  devices cannot be configured once the runtime has started.
  """
  c = train_config
  keras.utils.set_random_seed(c.seed)
  if c.deterministic:
    tf.config.experimental.enable_op_determinism()
  return _make_strategy(c.distribution, c.num_cpu_devices)


def _make_strategy(distribution: str, num_cpu_devices: int) -> tf.distribute.Strategy:
  """The default (one device) strategy, or MirroredStrategy over GPUs or logical CPUs."""
  if num_cpu_devices > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_cpu_devices)
  if distribution == "mirrored":
    devices = [d.name for d in tf.config.list_logical_devices("GPU")]
    devices = devices or [d.name for d in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices)
  return tf.distribute.get_strategy()


def _replica_slice(batch):
  """This replica's rows of a global batch [B, ...]: B * r // n up to B * (r + 1) // n.

  Every replica reads the same global batch and takes its share, so the data iterator stays a
  plain (checkpointable) tf.data iterator and a step sees the same examples on any number of
  replicas; a replica whose share is empty contributes zero tokens, not NaN.
  """
  context = tf.distribute.get_replica_context()
  replica, replicas = context.replica_id_in_sync_group, context.num_replicas_in_sync
  size = tf.shape(batch[0])[0]
  start, end = size * replica // replicas, size * (replica + 1) // replicas
  return [tensor[start:end] for tensor in batch]


def make_train_step(model, optimizer, strategy, label_smoothing: float):
  """The compiled training step: one global batch, one optimizer update.

  Returns:
    fn(iterator) -> dict of float32 scalars summed over replicas: "loss" (label-smoothed),
    "nll", "correct" and "tokens" (real target tokens of the step). `iterator` yields
    (source_ids, target_input_ids, target_ids) int32 [batch, length].
  """

  def replica_step(*batch):
    source_ids, target_input_ids, target_ids = _replica_slice(batch)
    with tf.GradientTape() as tape:
      memory, bias = model.encode(source_ids, training=True)
      hidden = model.decode(target_input_ids, memory, bias, training=True)
      # only real target positions reach the [tokens, vocab] softmax, the costliest matmul
      real = tf.where(tf.not_equal(target_ids, PAD_ID))
      stats = losses.token_statistics(model.logits(tf.gather_nd(hidden, real)),
                                      tf.gather_nd(target_ids, real), label_smoothing)
      # normalise by the tokens of the whole step, so replicas' gradients sum to the mean
      tokens = tf.distribute.get_replica_context().all_reduce("sum", stats["tokens"])
      loss = stats["loss"] / tf.maximum(tokens, 1.0)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return stats

  @tf.function
  def train_step(iterator):
    stats = strategy.run(replica_step, args=next(iterator))
    return {key: strategy.reduce("sum", value, axis=None) for key, value in stats.items()}

  return train_step


def make_optimizer(model_config, train_config) -> keras.optimizers.Optimizer:
  """Adam(0.9, 0.98, 1e-9) on the Noam schedule (section 5.3)."""
  c = train_config
  return keras.optimizers.Adam(
      NoamSchedule(model_config.d_model, c.warmup_steps, c.learning_rate), beta_1=0.9,
      beta_2=0.98, epsilon=1e-9, global_clipnorm=c.clip_norm or None)


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
    model_dir.check_config(c.model_dir, model_config)
    with self.strategy.scope():
      self.model = Transformer(**dataclasses.asdict(model_config))
      self.optimizer = make_optimizer(model_config, c)
      self.optimizer.build(self.model.trainable_variables)
      self.best_bleu = tf.Variable(-1.0, trainable=False, name="best_bleu")
      self.evals_without_improvement = tf.Variable(0, trainable=False,
                                                   name="evals_without_improvement")
    self.iterator = iter(data.train_batches(c.seed))
    # Keras keeps dropout RNG states outside the model's weights; saving them makes a resumed
    # run draw the same dropout masks as an uninterrupted one
    weight_ids = {id(w) for w in self.model.weights}
    dropout_states = [v for v in self.model.variables if id(v) not in weight_ids]
    checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                     iterator=self.iterator, dropout_states=dropout_states,
                                     best_bleu=self.best_bleu,
                                     evals_without_improvement=self.evals_without_improvement)
    self.manager = tf.train.CheckpointManager(checkpoint, c.model_dir, c.keep_checkpoints,
                                              checkpoint_name="ckpt")
    self.best_manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=self.model), os.path.join(c.model_dir, "best"), 1,
        checkpoint_name="ckpt")
    if self._restore(self.manager):
      logging.info("resumed from %s at step %d", self.manager.latest_checkpoint, self.step)
    search = dataclasses.replace(decode_config, beam_size=c.eval_beam_size, nbest=1)
    self.translator = Translator(self.model, data.vocabulary, **dataclasses.asdict(search))
    self._loss_statistics = evaluation.make_loss_statistics(self.model, c.label_smoothing)
    self._train_step = make_train_step(self.model, self.optimizer, strategy, c.label_smoothing)
    self._writers = {name: tf.summary.create_file_writer(os.path.join(c.model_dir, name))
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
      path = os.path.join(self.config.model_dir, "test_hypotheses.txt")
      with open(path, "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in hypotheses)
      logging.info("test: %s (%s); hypotheses in %s", bleu, results["bleu_signature"], path)
    with open(os.path.join(self.config.model_dir, "results.json"), "w") as f:
      json.dump(results, f, indent=2)
    return results
