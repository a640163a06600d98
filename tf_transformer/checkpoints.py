"""A model directory's checkpoints: which one a `checkpoint` setting names, restoring it (with the
vocabulary, for inference), averaging the newest ones, and sweeping what a killed save left
behind. All through tf.io.gfile."""

import contextlib
import os
import re

import numpy as np
import tensorflow as tf
from absl import logging

from common.files import TEMPORARY_MARK
from data_pipeline import tokenizer
from tf_transformer.decoding import ensemble
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.model import build_model
from tf_transformer.model_dir import ModelDirError

AVERAGE_DIR = "average"  # where `average` writes, in a model directory
EMA_DIR = "ema"  # where training with an ema_decay writes the moving average of the weights
FINAL_FILE = "final.json"  # the weights the run chose by dev at its end (final_weights.py)


def latest_checkpoint(folder: str) -> str | None:
  """The newest complete checkpoint of `folder`, None if it has none yet; a ModelDirError if
  its `checkpoint` state file names none that exists (TensorFlow would only log that)."""
  state = os.path.join(folder, "checkpoint")
  latest = tf.train.latest_checkpoint(folder)
  if latest is None and tf.io.gfile.exists(state):
    raise ModelDirError(f"{state}: names no readable checkpoint (a corrupt file, or its "
                        "checkpoints are gone); delete it and the checkpoints it named, or use "
                        "another {model_dir:name}", model_dir=None)
  return latest


def checkpoint_step(path: str) -> int:
  """The step of the checkpoint `.../ckpt-<step>`; 0 when its name holds none."""
  match = re.search(r"-(\d+)$", path)
  return int(match.group(1)) if match else 0


def training_checkpoints(model_dir: str) -> list[str]:
  """The checkpoints `model_dir`'s `checkpoint` state file records (the last
  keep_checkpoints of training), oldest first; [] when it has none."""
  if not latest_checkpoint(model_dir):  # refuses a corrupt state file, which TF only logs
    return []
  state = tf.train.get_checkpoint_state(model_dir)
  return sorted(state.all_model_checkpoint_paths, key=checkpoint_step)


def choose_checkpoint(model_dir: str, checkpoint: str = "final") -> str:
  """The path of the checkpoint of `model_dir` that `checkpoint` names.

  Args:
    checkpoint: "final" (the one final.json names: the weights the run chose by dev BLEU at
      its end, see final_weights.py; "best" when there is none), "best" (the best by dev
      BLEU, in model_dir/best; else the latest), "latest"
      (the newest training checkpoint), "average" (model_dir/average's, written by
      checkpoints.average), "ema" (model_dir/ema's, the moving average of the
      weights that training with an ema_decay writes at each save) or a checkpoint path prefix
      such as models/x/ckpt-2000.

  Raises:
    ModelDirError: there is no such checkpoint.
  """
  if checkpoint == "final":
    final = os.path.join(model_dir, FINAL_FILE)
    if not tf.io.gfile.exists(final):
      return choose_checkpoint(model_dir, "best")
    path = os.path.join(model_dir, model_dir_lib.read_json(final)["checkpoint"])
    if not tf.io.gfile.exists(f"{path}.index"):
      raise ModelDirError(f"{final}: names {path}, which is gone; give {{checkpoint}}, "
                          "latest, average or ema", checkpoint="best")
    return path
  if checkpoint == "best":
    best_dir = os.path.join(model_dir, "best")
    path = latest_checkpoint(best_dir)
    if not path:
      path = _latest_training_checkpoint(model_dir)
      logging.info("%s: no best checkpoint (no dev BLEU yet); loading the latest, %s", best_dir,
                   path)
    return path
  if checkpoint == "latest":
    return _latest_training_checkpoint(model_dir)
  written_by = {
      AVERAGE_DIR: ("no averaged checkpoint; write one with checkpoints.average (the tool: "
                    "python -m tf_transformer.bin.average_checkpoints)"),
      EMA_DIR: "no moving average of the weights; train with an {ema_decay:name} to keep one"}
  if checkpoint in written_by:
    folder = os.path.join(model_dir, checkpoint)
    path = latest_checkpoint(folder)
    if not path:
      raise ModelDirError(f"{folder}: {written_by[checkpoint]}", ema_decay=None)
    return path
  if not tf.io.gfile.exists(f"{checkpoint}.index"):
    raise ModelDirError(f"{checkpoint}: no such checkpoint ({checkpoint}.index is missing); "
                        "{checkpoint:name} takes final, best, latest, average, ema or a checkpoint "
                        f"path such as {os.path.join(model_dir, 'ckpt-1000')}", checkpoint=None)
  return checkpoint


def _latest_training_checkpoint(model_dir: str) -> str:
  path = latest_checkpoint(model_dir)
  if not path:
    raise ModelDirError(f"{model_dir}: no checkpoint to load")
  return path


class IteratorStateError(ModelDirError):
  """A checkpoint's input-pipeline position that this pipeline cannot read (saved by another
  version of it); everything else in the checkpoint may still restore."""


def restore(checkpoint: tf.train.Checkpoint, path: str, partial: bool = False):
  """Restores `path` into `checkpoint`, or raises ModelDirError naming it (IteratorStateError
  when only the saved iterator does not fit).

  Args:
    partial: allow the checkpoint to hold more than `checkpoint` tracks (e.g. the optimizer).
  """
  try:
    status = checkpoint.restore(path)
    if partial:
      status.expect_partial()
    status.assert_existing_objects_matched()
  except (tf.errors.OpError, ValueError, AssertionError, IndexError) as e:
    reason = str(e).strip().splitlines()[0][:200]
    error = IteratorStateError if "DeserializeIterator" in str(e) else ModelDirError
    raise error(f"{path}: cannot restore this checkpoint ({reason}); delete it to resume from "
                "an earlier one, or use another {model_dir:name}", model_dir=None) from None


def save(manager: tf.train.CheckpointManager, step: int) -> str:
  """`manager.save(checkpoint_number=step)`; a save that fails (a full disk) leaves nothing
  behind: its partial files are removed before the error goes on."""
  try:
    return manager.save(checkpoint_number=step)
  except (tf.errors.OpError, OSError):
    # the save's own error is the one to report, not one of the sweep
    with contextlib.suppress(tf.errors.OpError, OSError, ModelDirError):
      remove_partial_saves(manager.directory)
    raise


def remove_partial_saves(folder: str):
  """Deletes what a killed checkpoint save left in `folder`: its `<prefix>-N_temp` folder
  and the files of a checkpoint newer than the last one recorded as complete."""
  for temporary in tf.io.gfile.glob(os.path.join(folder, "*_temp")):
    try:
      tf.io.gfile.rmtree(temporary)
    except tf.errors.OpError:
      pass  # a leftover that cannot be removed is never read
  for temporary in tf.io.gfile.glob(os.path.join(folder, f"*{TEMPORARY_MARK}*")):
    tf.io.gfile.remove(temporary)
  latest = latest_checkpoint(folder)
  newest = checkpoint_step(latest) if latest else -1
  for path in tf.io.gfile.glob(os.path.join(folder, "ckpt-*")):
    match = re.fullmatch(r"ckpt-(\d+)\.(index|data-\d+-of-\d+)", os.path.basename(path))
    if match and int(match.group(1)) > newest:
      tf.io.gfile.remove(path)




def _newest_checkpoints(model_dir: str, last: int) -> list[str]:
  """The `last` newest training checkpoints of `model_dir`, oldest first."""
  paths = training_checkpoints(model_dir)
  if not paths:
    raise ModelDirError(f"{model_dir}: no training checkpoint to average")
  if len(paths) < last:
    names = ", ".join(os.path.basename(path) for path in paths)
    raise ModelDirError(f"{model_dir}: {{last}}, but its checkpoint file records "
                        f"{len(paths)} checkpoint(s) ({names}); lower {{last:name}}", last=last)
  return paths[-last:]


def average(model_dir: str, last: int) -> str:
  """Averages the model weights of the `last` newest training checkpoints of `model_dir` (not
  their optimizer moments, data position or counters).

  The mean is taken in float64 and cast back to each weight's dtype. It is written as
  `model_dir`/average/ckpt-<newest step averaged>, beside average.json naming the checkpoints
  averaged; the checkpoint "average" loads it.

  Returns:
    The averaged checkpoint's path.

  Raises:
    ModelDirError: the model directory has fewer than `last` checkpoints, or one is unreadable.
  """
  model_dir_lib.check_exists(model_dir)
  model = build_model(model_dir_lib.read_config(model_dir))
  paths = _newest_checkpoints(model_dir, last)
  checkpoint = tf.train.Checkpoint(model=model)
  sums = [np.zeros(weight.shape, np.float64) for weight in model.weights]
  for number, path in enumerate(paths, start=1):
    restore(checkpoint, path, partial=True)
    logging.info("read %s (%d of %d)", path, number, len(paths))
    for total, weight in zip(sums, model.weights):
      total += weight.numpy()
  for total, weight in zip(sums, model.weights):
    weight.assign((total / len(paths)).astype(weight.dtype))
  average_dir = os.path.join(model_dir, AVERAGE_DIR)
  remove_partial_saves(average_dir)
  # keeps one: the checkpoint it replaces is deleted
  manager = tf.train.CheckpointManager(checkpoint, average_dir, max_to_keep=1,
                                       checkpoint_name="ckpt")
  path = save(manager, checkpoint_step(paths[-1]))
  model_dir_lib.write_json(os.path.join(average_dir, "average.json"),
                           {"checkpoint": os.path.basename(path),
                            "averaged": [os.path.basename(p) for p in paths]})
  return path


def load_for_inference(model_dir: str, src_lang: str, tgt_lang: str, checkpoint: str = "final"):
  """The trained model at a checkpoint of `model_dir`, and its vocabulary.

  Args:
    checkpoint: final, best, latest, average, ema or a checkpoint path
      (choose_checkpoint).

  Returns:
    (Transformer, tokenizer.Vocabulary, the step of the checkpoint loaded).
  """
  model_dir_lib.check_exists(model_dir)
  model_config = model_dir_lib.read_config(model_dir)
  paths = tokenizer.vocabulary_paths(model_dir, model_config.shared_vocab, src_lang,
                                     tgt_lang)
  for path in paths:
    if not tf.io.gfile.exists(path):
      raise ModelDirError(f"{path}: no such file (check {{src_lang:name}}/{{tgt_lang:name}})",
                          src_lang=None, tgt_lang=None)
  vocabulary = tokenizer.load_vocabulary(*paths)
  path = choose_checkpoint(model_dir, checkpoint)
  model = build_model(model_config)
  restore(tf.train.Checkpoint(model=model), path, partial=True)
  return model, vocabulary, checkpoint_step(path)


def load_ensemble_for_inference(model_dirs, src_lang: str, tgt_lang: str,
                                checkpoint: str = "final", weights=()):
  """The models of several directories, at `checkpoint` each, as one ensemble.Ensemble.

  Args:
    model_dirs: two or more model directories, whose subword models must be the same.
    weights: one per directory, > 0 (default: equal).

  Returns:
    (ensemble.Ensemble, the shared tokenizer.Vocabulary, [the step of each checkpoint]).

  Raises:
    ModelDirError: fewer than two directories, weights that do not match them, a directory
      that is unusable, or two whose vocabularies differ (one line naming both).
  """
  model_dirs = list(model_dirs)
  if len(model_dirs) < 2:
    raise ModelDirError(f"an ensemble needs at least two model directories, got {model_dirs}")
  if weights and (len(weights) != len(model_dirs) or min(weights) <= 0):
    raise ModelDirError(f"{len(model_dirs)} ensemble members need as many weights > 0, got "
                        f"{list(weights)}")
  loaded = [load_for_inference(model_dir, src_lang, tgt_lang, checkpoint)
            for model_dir in model_dirs]
  vocabulary = loaded[0][1]
  for model_dir, (_, other, _) in zip(model_dirs[1:], loaded[1:]):
    if _subword_bytes(other) != _subword_bytes(vocabulary):
      raise ModelDirError(f"{model_dirs[0]} and {model_dir} have different vocabularies (their "
                          "subword models differ): an ensemble's members must share one")
  members = ensemble.Ensemble(tuple(model for model, _, _ in loaded), tuple(weights))
  return members, vocabulary, [step for _, _, step in loaded]


def _subword_bytes(vocabulary) -> tuple:
  """The bytes of a vocabulary's source and target subword models."""
  return tuple(tf.io.gfile.GFile(path, "rb").read()
               for path in (vocabulary.source_model_path, vocabulary.target_model_path))
