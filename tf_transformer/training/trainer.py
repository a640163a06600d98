"""The training loop (step, log, save, evaluate); a run's parts are assembled in run.py."""

import dataclasses
import math
import os
import shutil
import signal
import time
from typing import Any, Callable, Iterator

import keras
import tensorflow as tf
from absl import logging

from common.errors import UserError
from common.progress import ProgressBar
from tf_transformer import checkpoints, model_dir
from tf_transformer.training import final_weights
from tf_transformer.training.evaluator import Evaluator
from tf_transformer.training.train_step import all_finite

_LOG_EVERY = 50  # steps between progress-bar/TensorBoard updates of the training statistics


class TrainingInterrupted(RuntimeError):
  """Training stopped by a signal after saving a checkpoint."""


class NonFiniteTraining(UserError):
  """The loss or the gradients became NaN/Inf (see TrainConfig.on_nonfinite); nothing non-finite was
  applied or saved."""


class TrainingClock:
  """The seconds the training loop has run, over every resume: `seconds` is a variable that
  every checkpoint saves; a train_minutes budget stops the run on it.

  With several workers, whether the budget is spent is agreed by an all-reduce every
  `_LOG_EVERY` steps, which every worker calls at the same steps (each worker's clock differs).
  """

  def __init__(self, strategy: tf.distribute.Strategy, num_workers: int):
    self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="trained_seconds")
    self._strategy = strategy
    self._num_workers = num_workers
    self._origin = None  # time.monotonic() at which `seconds` were 0, while the loop runs

  def start(self):
    self._origin = time.monotonic() - float(self.seconds.numpy())

  def stop(self):
    self.record()
    self._origin = None

  def record(self):
    """Writes the running time into `seconds` (before a checkpoint is saved)."""
    self.seconds.assign(self.elapsed())

  def elapsed(self) -> float:
    if self._origin is None:
      return float(self.seconds.numpy())
    return time.monotonic() - self._origin

  def spent(self, minutes: float | None, step: int) -> bool:
    """Whether `minutes` (None: no budget) are spent on any worker, as of `step`."""
    if not minutes:
      return False
    if self._num_workers == 1:
      return self.elapsed() >= minutes * 60
    if step % _LOG_EVERY:
      return False
    vote = self.elapsed() >= minutes * 60
    votes = self._strategy.run(lambda: tf.constant(1 if vote else 0, tf.int32))
    return bool(self._strategy.reduce(tf.distribute.ReduceOp.SUM, votes, axis=None).numpy() > 0)


class _Window:
  """The summed step statistics and the wall time since the last log line."""

  def __init__(self):
    self.sums = dict.fromkeys(("loss", "nll", "correct", "tokens", "clipped", "steps",
                               "grad_norm", "norm_steps", "rdrop_kl"), 0.0)
    self.rdrop = False
    self.restart_clock()

  def restart_clock(self):
    self.start = time.perf_counter()

  def add(self, stats: dict):
    for key in ("loss", "nll", "correct", "tokens", "clipped"):
      self.sums[key] += float(stats[key])
    if "rdrop_kl" in stats:
      self.rdrop = True
      self.sums["rdrop_kl"] += float(stats["rdrop_kl"])
    self.sums["steps"] += 1
    norm = float(stats["grad_norm"])
    if math.isfinite(norm):  # not under mixed_float16 while the loss scale overflows
      self.sums["grad_norm"] += norm
      self.sums["norm_steps"] += 1

  def scalars(self, learning_rate: float) -> dict:
    """Token-averaged loss, accuracy and perplexity, the learning rate, tokens/s, the mean
    gradient norm (before clipping) and the fraction of steps that clipping shortened; with
    R-Drop, the token-averaged symmetric KL divergence of the two passes ("rdrop_kl")."""
    tokens = max(self.sums["tokens"], 1.0)
    steps = max(self.sums["steps"], 1.0)
    norm_steps = max(self.sums["norm_steps"], 1.0)
    return {"loss": self.sums["loss"] / tokens, "accuracy": self.sums["correct"] / tokens,
            "perplexity": math.exp(min(self.sums["nll"] / tokens, 50.0)),
            "learning_rate": learning_rate,
            "tokens_per_sec": self.sums["tokens"] / (time.perf_counter() - self.start),
            "grad_norm": self.sums["grad_norm"] / norm_steps,
            "clip_fraction": self.sums["clipped"] / steps,
            **({"rdrop_kl": self.sums["rdrop_kl"] / tokens} if self.rdrop else {})}


@dataclasses.dataclass
class Trainer:
  """Runs a training loop over parts built elsewhere (see `create_trainer`).

  Attributes:
    model: the Transformer (kept for callers that translate or inspect it).
    optimizer: its `iterations` counts the steps.
    train_step: fn(iterator) -> step statistics, from train_step.make_train_step.
    iterator: the training batches; `manager` checkpoints it with the rest.
    manager: tf.train.CheckpointManager of the whole training state.
    evaluator: an Evaluator (dev BLEU, best checkpoint, early stopping, test score).
    writer: tf.summary writer of the training figures.
    config: the TrainConfig.
    write_dir: where this worker writes; the chief's is the model directory, another
      worker's a temporary folder removed at the end.
    clock: the TrainingClock whose `seconds` the checkpoints save.
    is_chief: whether this worker writes results.json.
    ema_manager: with an ema_decay, a CheckpointManager of the model alone, into which each
      save also writes the moving average of the weights (model_dir/ema); else None.
    compiled_shapes: (rows, length) of the batches the step has seen.
    nonfinite_steps: steps skipped in this process for a NaN/Inf loss or gradient.
  """
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  train_step: Callable
  iterator: Iterator
  manager: tf.train.CheckpointManager
  evaluator: Evaluator
  writer: tf.summary.SummaryWriter
  config: Any
  write_dir: str
  clock: TrainingClock
  is_chief: bool = True
  ema_manager: tf.train.CheckpointManager | None = None
  compiled_shapes: set = dataclasses.field(default_factory=set)
  nonfinite_steps: int = 0
  _profiling: bool = False

  @property
  def step(self) -> int:
    return int(self.optimizer.iterations.numpy())

  def train(self) -> dict:
    """Runs until train_steps, train_minutes or early stopping; returns the final dev/test
    results.

    Raises:
      TrainingInterrupted: SIGINT/SIGTERM arrived; a checkpoint of the last step was saved.
    """
    stop = []
    # the handlers stay until _loop's last save is written: a second signal during that save
    # is noted, not raised in the middle of the write
    handlers = {sig: signal.signal(sig, lambda *_: stop.append(True))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
      self._loop(stop)
    finally:
      for sig, handler in handlers.items():
        signal.signal(sig, handler)
    if stop:
      raise TrainingInterrupted(
          f"stopped at step {self.step}; checkpoint saved in {self.config.model_dir}; rerun "
          "the same command to resume")
    return self._finish()

  def _loop(self, stop: list):
    c = self.config
    step = self.step
    budget_left = None
    if c.train_minutes:
      logging.info("train_minutes=%g: %.2f of them trained before", c.train_minutes,
                   self.clock.elapsed() / 60)
      budget_left = c.train_minutes * 60 - self.clock.elapsed()
    progress = ProgressBar(c.train_steps, unit="step", initial=step, time_limit_s=budget_left)
    window = _Window()
    nonfinite_in_a_row = 0
    self.clock.start()
    spent = self.clock.spent(c.train_minutes, step)  # a spent run, resumed, trains no more
    try:
      while step < c.train_steps and not stop and not spent:
        self._profile(step + 1)
        stats = self.train_step(self.iterator)
        self._note_shapes(stats["shapes"].numpy())
        if not float(stats["finite"]):
          nonfinite_in_a_row += 1
          self._nonfinite_step(step + 1, nonfinite_in_a_row)
          continue
        nonfinite_in_a_row = 0
        step += 1
        window.add(stats)
        spent = self.clock.spent(c.train_minutes, step)
        last = step == c.train_steps or spent
        if step % _LOG_EVERY == 0 or last:
          self._log(step, window.scalars(float(self.optimizer.learning_rate)), progress)
          window = _Window()
        # evaluate first, so a checkpoint holds the dev results of its own step: a run killed
        # while evaluating resumes from the previous checkpoint and evaluates this step again
        if step % c.eval_every == 0 or last:
          stop_early = self.evaluator.evaluate_and_select(step)
          window.restart_clock()  # evaluation time is not training throughput
          if stop_early:
            logging.info("early stopping: no better dev BLEU in %d evaluations",
                         c.early_stopping)
            break
        if step % c.save_every == 0:
          self._save(step)
        if spent:
          logging.info("train_minutes=%g: stopping at step %d after %.1f minutes of training",
                       c.train_minutes, step, self.clock.elapsed() / 60)
          break
    finally:
      progress.close()
      self._profile(None)
      self.clock.stop()
    if not (self.manager.latest_checkpoint or "").endswith(f"-{step}"):
      self._save(step)

  def _profile(self, next_step: int | None):
    """Starts TensorFlow's profiler before step A of profile_steps="A,B" and stops it after
    step B (next_step None: the loop ended); TensorBoard's Profile tab shows the trace."""
    if not self.config.profile_steps or not self.is_chief:
      return
    first, last = self.config.profile_steps
    if next_step == first:
      tf.profiler.experimental.start(os.path.join(self.config.model_dir, "train"))
      self._profiling = True
      logging.info("profiling steps %d to %d", first, last)
    elif self._profiling and (next_step is None or next_step > last):
      tf.profiler.experimental.stop()
      self._profiling = False
      logging.info("profile of steps %d to %d written; see TensorBoard's Profile tab", first,
                   last)

  def _save(self, step: int):
    """Checkpoints the training state, and the moving average of the weights with
    an ema_decay, unless a weight is not finite."""
    if not all_finite(self.model.weights + self.optimizer.variables):
      raise NonFiniteTraining(
          f"step {step}: a weight or optimizer moment is NaN or Inf, so no checkpoint was "
          f"written; "
          f"{self._last_good()}; lower {{learning_rate:name}} or set {{clip_norm:name}}",
          learning_rate=None, clip_norm=None)
    self.clock.record()
    # the average first: a run killed between the two saves redoes both from the previous one
    if self.ema_manager:
      weights = self.model.trainable_variables
      trained = [tf.identity(weight) for weight in weights]
      self.optimizer.finalize_variable_values(weights)  # the average into the model, saved
      checkpoints.save(self.ema_manager, step)
      for weight, value in zip(weights, trained):
        weight.assign(value)
    checkpoints.save(self.manager, step)

  def _last_good(self) -> str:
    latest = self.manager.latest_checkpoint
    return f"the last good checkpoint is {latest}" if latest else "no checkpoint was saved yet"

  def _nonfinite_step(self, step: int, in_a_row: int):
    """Counts a skipped non-finite step; raises NonFiniteTraining when the run must stop."""
    self.nonfinite_steps += 1
    with self.writer.as_default(step=step):
      tf.summary.scalar("nonfinite_steps", self.nonfinite_steps)
    message = (f"step {step}: the loss or the gradients are NaN or Inf; the update was not "
               f"applied")
    c = self.config
    if c.on_nonfinite == "stop" or in_a_row >= c.max_nonfinite_steps:
      reason = "" if c.on_nonfinite == "stop" else f" ({in_a_row} such steps in a row)"
      raise NonFiniteTraining(
          f"{message}{reason}; {self._last_good()}; lower {{learning_rate:name}} or set "
          "{clip_norm:name} (or {on_nonfinite:name}=skip to skip such steps)",
          learning_rate=None, clip_norm=None, on_nonfinite=None)
    logging.warning("%s (skipped; %d in a row)", message, in_a_row)

  def _log(self, step: int, scalars: dict, progress: ProgressBar):
    if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
      scalars["loss_scale"] = float(self.optimizer.dynamic_scale.numpy())
    with self.writer.as_default(step=step):
      for name, value in scalars.items():
        tf.summary.scalar(name, value)
    progress.update(step, {"loss": round(scalars["loss"], 3),
                           "acc": round(scalars["accuracy"], 3),
                           "lr": float(f"{scalars['learning_rate']:.2e}"),
                           "tok/s": round(scalars["tokens_per_sec"])})

  def _note_shapes(self, shapes):
    """Logs each batch shape seen for the first time: under jit_compile each one costs an
    XLA compilation, and bucketing keeps them to one per length bucket."""
    for rows, length in shapes.tolist():
      if (rows, length) not in self.compiled_shapes:
        self.compiled_shapes.add((rows, length))
        if self.config.jit_compile:
          logging.info("XLA: train step compiled for batches of [%d, %d] (%d shapes so far)",
                       rows, length, len(self.compiled_shapes))

  def _choose_final_weights(self) -> dict:
    """The best checkpoint, the average of the last checkpoints and the moving average, scored
    on dev; the winner's weights stay in the model and final.json names them (results.json's
    final_weights and dev_bleu_<candidate>; TensorBoard's final/dev_bleu_<candidate>)."""
    c = self.config
    paths = final_weights.candidates(c.model_dir, c.average_last)
    if not paths:
      return {}
    winner, scores = final_weights.choose(self.model, self.evaluator.dev_bleu, paths)
    final_weights.record(c.model_dir, winner, paths[winner], scores, self.step)
    with self.evaluator.writer.as_default(step=self.step):
      for name, score in scores.items():
        tf.summary.scalar(f"final/dev_bleu_{name}", score)
      tf.summary.text("final/choice", f"{winner} ({paths[winner]}), dev BLEU "
                      + ", ".join(f"{name} {score:.2f}" for name, score in scores.items()))
    return {"final_weights": winner, **{f"dev_bleu_{name}": score
                                         for name, score in scores.items()}}

  def _finish(self) -> dict:
    """Chooses the final weights by dev BLEU (the chief, when there are dev sentences), scores
    them on the test set once; the chief writes results.json."""
    results = {"step": self.step, "best_dev_bleu": float(self.evaluator.best_bleu.numpy())}
    if self.config.train_minutes:
      results["trained_minutes"] = round(self.clock.elapsed() / 60, 2)
    chosen = self.is_chief and any(self.evaluator.data.dev_pairs(
        self.config.eval_sentences).values())
    if chosen:
      results.update(self._choose_final_weights())
    results.update(self.evaluator.test(self.write_dir, self.step, restore_best=not chosen))
    if self.is_chief:
      model_dir.write_json(os.path.join(self.config.model_dir, "results.json"), results)
    else:
      shutil.rmtree(self.write_dir, ignore_errors=True)
    return results
