"""The assembly of a training run: the model and optimizer under the distribution strategy,
the checkpoint it resumes from (or the weights a fine-tuning starts from), the summary writers,
the evaluator and the train step, handed to a trainer.Trainer."""

import dataclasses
import os
import tempfile
from typing import Callable, Iterator

import tensorflow as tf
from absl import logging

from tf_transformer import checkpoints, model_dir, runtime
from tf_transformer.model import build_model
from tf_transformer.training import fine_tuning
from tf_transformer.training.evaluator import Evaluator
from tf_transformer.training.optimizer import make_optimizer
from tf_transformer.training.train_step import make_train_step
from tf_transformer.training.trainer import Trainer, TrainingClock


def _write_hparams(folder: str, *configs):
  """The run's settings for TensorBoard's HParams tab, which then tabulates the runs of a
  parent logdir with their train/ and eval/ figures (dev BLEU, chrF, loss) side by side."""
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
    decode_config: the search of the dev/test translations (beam size: eval_beam_size).
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
      fine_tuning.load_weights(model, start, data.vocabulary)
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
                               c.jit_compile, c.clip_norm, c.rdrop_alpha)
  return Trainer(model, optimizer, train_step, checkpoint.iterator, manager, evaluator,
                 writers["train"], c, write_dir, clock, is_chief, ema_manager)

