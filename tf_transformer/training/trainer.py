"""The training loop (step, log, save, evaluate) and the assembly of a run's parts."""

import dataclasses
import math
import os
import shutil
import signal
import tempfile
import time
from typing import Any, Callable, Iterator

import keras
import tensorflow as tf
from absl import logging

from common.errors import UserError
from common.progress import ProgressBar
from tf_transformer import checkpoints, model_dir, runtime
from tf_transformer.training import final_weights, fine_tuning
from tf_transformer.training.evaluator import Evaluator
from tf_transformer.model import build_model
from tf_transformer.training.optimizer import make_optimizer
from tf_transformer.training.train_step import all_finite, make_train_step

_LOG_EVERY = 50  # steps between progress-bar/TensorBoard updates of the training statistics


class TrainingInterrupted(RuntimeError):
  """Training stopped by a signal after saving a checkpoint."""


class NonFiniteTraining(UserError):
  """The loss or the gradients became NaN/Inf (see --on_nonfinite); nothing non-finite was
  applied or saved."""


class TrainingClock:
  """The seconds the training loop has run, over every resume: `seconds` is a variable that
  every checkpoint saves; --train_minutes stops the run on it.

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
                               "grad_norm", "norm_steps"), 0.0)
    self.restart_clock()

  def restart_clock(self):
    self.start = time.perf_counter()

  def add(self, stats: dict):
    for key in ("loss", "nll", "correct", "tokens", "clipped"):
      self.sums[key] += float(stats[key])
    self.sums["steps"] += 1
    norm = float(stats["grad_norm"])
    if math.isfinite(norm):  # not under mixed_float16 while the loss scale overflows
      self.sums["grad_norm"] += norm
      self.sums["norm_steps"] += 1

  def scalars(self, learning_rate: float) -> dict:
    """Token-averaged loss, accuracy and perplexity, the learning rate, tokens/s, the mean
    gradient norm (before clipping) and the fraction of steps that clipping shortened."""
    tokens = max(self.sums["tokens"], 1.0)
    steps = max(self.sums["steps"], 1.0)
    norm_steps = max(self.sums["norm_steps"], 1.0)
    return {"loss": self.sums["loss"] / tokens, "accuracy": self.sums["correct"] / tokens,
            "perplexity": math.exp(min(self.sums["nll"] / tokens, 50.0)),
            "learning_rate": learning_rate,
            "tokens_per_sec": self.sums["tokens"] / (time.perf_counter() - self.start),
            "grad_norm": self.sums["grad_norm"] / norm_steps,
            "clip_fraction": self.sums["clipped"] / steps}


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
    ema_manager: with --ema_decay, a CheckpointManager of the model alone, into which each
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
    """Runs until --train_steps, --train_minutes or early stopping; returns the final dev/test
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
      logging.info("--train_minutes=%g: %.2f of them trained before", c.train_minutes,
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
          logging.info("--train_minutes=%g: stopping at step %d after %.1f minutes of training",
                       c.train_minutes, step, self.clock.elapsed() / 60)
          break
    finally:
      progress.close()
      self._profile(None)
      self.clock.stop()
    if not (self.manager.latest_checkpoint or "").endswith(f"-{step}"):
      self._save(step)

  def _profile(self, next_step: int | None):
    """Starts TensorFlow's profiler before step A of --profile_steps=A,B and stops it after
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
    --ema_decay, unless a weight is not finite."""
    if not all_finite(self.model.weights + self.optimizer.variables):
      raise NonFiniteTraining(
          f"step {step}: a weight or optimizer moment is NaN or Inf, so no checkpoint was "
          f"written; "
          f"{self._last_good()}; lower --learning_rate or set --clip_norm")
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
          f"{message}{reason}; {self._last_good()}; lower --learning_rate or set --clip_norm "
          "(or --on_nonfinite=skip to skip such steps)")
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
    """Logs each batch shape seen for the first time: under --jit_compile each one costs an
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


def _write_hparams(folder: str, *configs):
  """The run's settings for TensorBoard's HParams tab, which then tabulates the runs of a
  parent --logdir with their train/ and eval/ figures (dev BLEU, chrF, loss) side by side."""
  from tensorboard.plugins.hparams import api as hparams  # pylint: disable=g-import-not-at-top

  values = {}
  for config in configs:
    for name, value in dataclasses.asdict(config).items():
      if isinstance(value, (bool, int, float, str)) and name not in values:
        values[name] = value
  with tf.summary.create_file_writer(folder).as_default():
    hparams.hparams(values, trial_id=os.path.basename(os.path.normpath(folder)))


def create_model(model_config, train_config, strategy):
  """The Transformer and its optimizer, built in the strategy's scope with every variable
  created (so a checkpoint can be restored before the first step).

  Args:
    train_config: its mixed_precision resolved (`runtime.resolve_precision`), not "auto".

  Returns:
    (Transformer, keras optimizer).
  """
  precision = train_config.mixed_precision
  if precision == "auto":
    raise ValueError("create_model needs a resolved precision: see runtime.resolve_precision")
  policy = None if precision == "float32" else precision
  with strategy.scope():
    model = build_model(model_config, dtype=policy)
    optimizer = make_optimizer(model_config, train_config)
    optimizer.build(model.trainable_variables)
  return model, optimizer


def _resume(parts: dict, path: str, new_iterator: Callable[[], Iterator],
            clock: TrainingClock):
  """Restores the training checkpoint `path` into a tf.train.Checkpoint of `parts`, and
  `clock` when the checkpoint has one (older ones have none).

  A checkpoint whose input-pipeline position was saved by another version of the pipeline
  resumes all the rest, with `new_iterator()` (the failed restore leaves the old one unusable).

  Returns:
    The checkpoint, whose "iterator" is the one to train with.
  """
  checkpoint = tf.train.Checkpoint(**parts)
  try:
    checkpoints.restore(checkpoint, path)
  except checkpoints.IteratorStateError:
    rest = {name: part for name, part in parts.items() if name != "iterator"}
    checkpoints.restore(tf.train.Checkpoint(**rest), path, partial=True)
    logging.warning("%s: its input-pipeline position is from another version of the pipeline; "
                    "resuming its weights and optimizer with a new pass over the data (the "
                    "run will not repeat an uninterrupted one exactly)", path)
    checkpoint = tf.train.Checkpoint(**rest, iterator=new_iterator())
    # this checkpoint restored nothing, so attaching the clock below will not restore it
    tf.train.Checkpoint(trained_seconds=clock.seconds).restore(path).expect_partial()
  return checkpoint


def create_trainer(data, model_config, train_config, decode_config,
                   strategy: tf.distribute.Strategy, start=None) -> Trainer:
  """Assembles a run: model, optimizer, this worker's data, checkpoints, evaluator, writers;
  resumes from the model directory's latest checkpoint when there is one.

  Args:
    data: the task's data, opened after `runtime.set_up_runtime` made `strategy`.
    decode_config: the search of the dev/test translations (beam size: --eval_beam_size).
    start: optional fine_tuning.Start: a run with no checkpoint yet starts from its weights.
  """
  c = train_config = runtime.resolve_precision(train_config, strategy)
  num_workers, worker_index, is_chief = runtime.worker_info(strategy)
  # only the chief writes into model_dir; other workers save into a folder thrown away
  write_dir = c.model_dir if is_chief else tempfile.mkdtemp(prefix="worker_")
  if is_chief:
    model_dir.check_config(c.model_dir, model_config)
    model_dir.check_optimizer(c.model_dir, c)
    for folder in (c.model_dir, os.path.join(c.model_dir, "best"),
                   os.path.join(c.model_dir, checkpoints.EMA_DIR)):
      checkpoints.remove_partial_saves(folder)  # and checks its checkpoint state is readable
  writers = {name: (tf.summary.create_file_writer(os.path.join(c.model_dir, name))
                    if is_chief else tf.summary.create_noop_writer())
             for name in ("train", "eval")}
  if is_chief:
    _write_hparams(c.model_dir, data.config, model_config, c, decode_config)
  model, optimizer = create_model(model_config, c, strategy)
  with strategy.scope():
    evaluator = Evaluator(model, data, c, decode_config, os.path.join(write_dir, "best"),
                          writers["eval"])
  new_iterator = lambda: iter(data.train_batches(c.seed, num_workers, worker_index))
  # Keras keeps dropout RNG states outside the model's weights; saving them makes a resumed
  # run draw the same dropout masks as an uninterrupted one
  weight_ids = {id(w) for w in model.weights}
  dropout_states = [v for v in model.variables if id(v) not in weight_ids]
  parts = dict(model=model, optimizer=optimizer, iterator=new_iterator(),
               dropout_states=dropout_states, **evaluator.state)
  # every worker resumes from the chief's checkpoint (model_dir is on a shared file system)
  latest = checkpoints.latest_checkpoint(c.model_dir)
  clock = TrainingClock(strategy, num_workers)
  if latest:
    checkpoint = _resume(parts, latest, new_iterator, clock)
    logging.info("resumed from %s at step %d", latest, int(optimizer.iterations.numpy()))
  else:
    checkpoint = tf.train.Checkpoint(**parts)
    if start is not None:
      fine_tuning.load_weights(model, start)
      logging.info("starting from the weights of %s (step %d of %s), with a new optimizer",
                   start.checkpoint, start.step, start.init_from)
  # attached after the restore, which then restores it if the checkpoint has it (an older
  # checkpoint, which has none, would fail the restore's check that every part is matched)
  checkpoint.trained_seconds = clock.seconds
  manager = tf.train.CheckpointManager(checkpoint, write_dir, c.keep_checkpoints,
                                       checkpoint_name="ckpt")
  ema_manager = None
  if c.ema_decay:
    ema_manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model), os.path.join(write_dir, checkpoints.EMA_DIR), 1,
        checkpoint_name="ckpt")
  train_step = make_train_step(model, optimizer, strategy, c.label_smoothing, c.update_freq,
                               c.jit_compile, c.clip_norm)
  return Trainer(model, optimizer, train_step, checkpoint.iterator, manager, evaluator,
                 writers["train"], c, write_dir, clock, is_chief, ema_manager)

