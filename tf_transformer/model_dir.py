"""What a model directory holds: the architecture (config.json), subword models, checkpoints.

Every file operation goes through tf.io.gfile, so a model directory may be on any TensorFlow
file system (gs://, file://, a local path).
"""

import dataclasses
import json
import os
import re

import tensorflow as tf
from absl import logging

from data_pipeline import tokenizer
from tf_transformer.config import ModelConfig
from tf_transformer.console import UserError
from tf_transformer.model import Transformer


AVERAGE_DIR = "average"  # where tf_transformer.average_checkpoints writes, in a model directory
EMA_DIR = "ema"  # where training with --ema_decay writes the moving average of the weights


class ModelDirError(UserError):
  """A model directory or checkpoint problem, in one line that names the path."""


def write_json(path: str, value):
  """Writes `value` as JSON into a temporary file renamed over `path`: a reader (or a run
  killed mid-write) sees the old file or the new one, never half of one."""
  temporary = f"{path}.tmp-{os.getpid()}"
  try:
    with tf.io.gfile.GFile(temporary, "w") as f:
      json.dump(value, f, indent=2)
    tf.io.gfile.rename(temporary, path, overwrite=True)
  finally:
    if tf.io.gfile.exists(temporary):
      tf.io.gfile.remove(temporary)


def check_recorded(path: str, current: dict, what: str):
  """Records `current` in the JSON file `path` at the first run; refuses a later run whose
  values differ, naming every differing field with both values."""
  if not tf.io.gfile.exists(path):
    tf.io.gfile.makedirs(os.path.dirname(path) or ".")
    write_json(path, current)
    return
  recorded = _read_json(path)
  differing = [key for key in sorted(set(recorded) | set(current))
               if recorded.get(key) != current.get(key)]
  if differing:
    was = ", ".join(f"{key}={recorded.get(key)!r}" for key in differing)
    now = ", ".join(f"{key}={current.get(key)!r}" for key in differing)
    raise ModelDirError(f"{path}: this model was created with {was}; the flags now give {now} "
                        f"({what}); use the same flags or another --model_dir")


def ensure_directory(model_dir: str):
  """Creates `model_dir` if needed; a file in its place is a ModelDirError."""
  if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
    raise ModelDirError(f"{model_dir}: not a directory (--model_dir names a folder)")
  try:
    tf.io.gfile.makedirs(model_dir)
  except tf.errors.FailedPreconditionError:  # its message names the file on the way, not model_dir
    raise ModelDirError(f"{model_dir}: Not a directory") from None


def latest_checkpoint(folder: str) -> str | None:
  """The newest complete checkpoint of `folder`, None if it has none yet; a ModelDirError if
  its `checkpoint` state file names none that exists (TensorFlow would only log that)."""
  state = os.path.join(folder, "checkpoint")
  latest = tf.train.latest_checkpoint(folder)
  if latest is None and tf.io.gfile.exists(state):
    raise ModelDirError(f"{state}: names no readable checkpoint (a corrupt file, or its "
                        "checkpoints are gone); delete it and the checkpoints it named, or use "
                        "another --model_dir")
  return latest


def checkpoint_step(path: str) -> int:
  """The step of the checkpoint `.../ckpt-<step>`; 0 when its name holds none."""
  match = re.search(r"-(\d+)$", path)
  return int(match.group(1)) if match else 0


def training_checkpoints(model_dir: str) -> list[str]:
  """The checkpoints `model_dir`'s `checkpoint` state file records (the last
  --keep_checkpoints of training), oldest first; [] when it has none."""
  if not latest_checkpoint(model_dir):  # refuses a corrupt state file, which TF only logs
    return []
  state = tf.train.get_checkpoint_state(model_dir)
  return sorted(state.all_model_checkpoint_paths, key=checkpoint_step)


def choose_checkpoint(model_dir: str, checkpoint: str = "best") -> str:
  """The path of the checkpoint of `model_dir` that `checkpoint` (--checkpoint) names.

  Args:
    checkpoint: "best" (the best by dev BLEU, in model_dir/best; else the latest), "latest"
      (the newest training checkpoint), "average" (model_dir/average's, written by
      tf_transformer.average_checkpoints), "ema" (model_dir/ema's, the moving average of the
      weights that training with --ema_decay writes at each save) or a checkpoint path prefix
      such as models/x/ckpt-2000.

  Raises:
    ModelDirError: there is no such checkpoint.
  """
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
      AVERAGE_DIR: ("no averaged checkpoint; write one with python -m "
                    f"tf_transformer.average_checkpoints --model_dir={model_dir} --last=N"),
      EMA_DIR: "no moving average of the weights; train with --ema_decay to keep one"}
  if checkpoint in written_by:
    folder = os.path.join(model_dir, checkpoint)
    path = latest_checkpoint(folder)
    if not path:
      raise ModelDirError(f"{folder}: {written_by[checkpoint]}")
    return path
  if not tf.io.gfile.exists(f"{checkpoint}.index"):
    raise ModelDirError(f"{checkpoint}: no such checkpoint ({checkpoint}.index is missing); "
                        "--checkpoint takes best, latest, average, ema or a checkpoint path "
                        f"such as {os.path.join(model_dir, 'ckpt-1000')}")
  return checkpoint


def _latest_training_checkpoint(model_dir: str) -> str:
  path = latest_checkpoint(model_dir)
  if not path:
    raise ModelDirError(f"{model_dir}: no checkpoint to load")
  return path


# config.json keys of earlier releases -> their names now
_RENAMED_CONFIG_KEYS = {"padding_aware_ffn": "skip_padding"}


def _upgraded_config(recorded: dict) -> dict:
  return {_RENAMED_CONFIG_KEYS.get(key, key): value for key, value in recorded.items()}


def check_config(model_dir: str, model_config: ModelConfig):
  """Records the architecture at the first run; refuses a later run with another one."""
  path = os.path.join(model_dir, "config.json")
  if tf.io.gfile.exists(path):
    recorded = _read_json(path)
    if _upgraded_config(recorded) != recorded:
      write_json(path, _upgraded_config(recorded))
  check_recorded(path, dataclasses.asdict(model_config), "the architecture")


def check_optimizer(model_dir: str, train_config):
  """Records what the optimizer's part of a checkpoint holds besides Adam's moments (Keras
  numbers its variables, so a moving average or a loss scale shifts every later one); refuses
  a rerun that would read the checkpoints with another layout."""
  c = train_config
  check_recorded(os.path.join(model_dir, "optimizer.json"),
                 {"moving_average": c.ema_decay > 0,
                  "loss_scaling": c.mixed_precision == "mixed_float16"},
                 "the optimizer state in the checkpoints: --ema_decay on or off, "
                 "--mixed_precision=mixed_float16 or not")


def check_data(model_dir: str, data_config):
  """Records what the subword models and the checkpoints depend on (languages, vocabulary
  size and type, shared or not) before any is built; refuses a later run with others."""
  c = data_config
  check_recorded(os.path.join(model_dir, "data.json"),
                 {"src_lang": c.src_lang, "tgt_lang": c.tgt_lang, "vocab_size": c.vocab_size,
                  "spm_model_type": c.spm_model_type, "shared_vocab": c.shared_vocab},
                 "the vocabulary")


def _read_json(path: str) -> dict:
  try:
    with tf.io.gfile.GFile(path) as f:
      value = json.load(f)
  except (OSError, ValueError, tf.errors.OpError) as e:
    raise ModelDirError(f"{path}: unreadable ({e}); use another --model_dir") from None
  if not isinstance(value, dict):
    raise ModelDirError(f"{path}: not a JSON object; use another --model_dir")
  return value


def remove_partial_saves(folder: str):
  """Deletes what a killed checkpoint save left in `folder`: its `<prefix>-N_temp` folder
  and the files of a checkpoint newer than the last one recorded as complete."""
  for temporary in tf.io.gfile.glob(os.path.join(folder, "*_temp")):
    try:
      tf.io.gfile.rmtree(temporary)
    except tf.errors.OpError:
      pass  # a leftover that cannot be removed is never read
  for temporary in tf.io.gfile.glob(os.path.join(folder, "*.tmp-*")):
    tf.io.gfile.remove(temporary)
  latest = latest_checkpoint(folder)
  newest = checkpoint_step(latest) if latest else -1
  for path in tf.io.gfile.glob(os.path.join(folder, "ckpt-*")):
    match = re.fullmatch(r"ckpt-(\d+)\.(index|data-\d+-of-\d+)", os.path.basename(path))
    if match and int(match.group(1)) > newest:
      tf.io.gfile.remove(path)


def read_config(model_dir: str) -> ModelConfig:
  path = os.path.join(model_dir, "config.json")
  if not tf.io.gfile.exists(path):
    raise ModelDirError(f"{path}: no such file; is {model_dir} a trained model directory?")
  try:
    return ModelConfig(**_upgraded_config(_read_json(path)))
  except TypeError as e:
    raise ModelDirError(f"{path}: not this project's model config ({e}); use another "
                        "--model_dir") from None


def restore(checkpoint: tf.train.Checkpoint, path: str, partial: bool = False):
  """Restores `path` into `checkpoint`, or raises ModelDirError naming it.

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
    raise ModelDirError(f"{path}: cannot restore this checkpoint ({reason}); delete it to "
                        "resume from an earlier one, or use another --model_dir") from None


def check_exists(model_dir: str):
  """Raises ModelDirError unless `model_dir` is an existing folder."""
  if not tf.io.gfile.exists(model_dir):
    raise ModelDirError(f"{model_dir}: no such directory")
  if not tf.io.gfile.isdir(model_dir):
    raise ModelDirError(f"{model_dir}: not a directory (--model_dir names a folder)")


def load_for_inference(model_dir: str, src_lang: str, tgt_lang: str, checkpoint: str = "best"):
  """The trained model at a checkpoint of `model_dir`, and its vocabulary.

  Args:
    checkpoint: best, latest, average, ema or a checkpoint path (see `choose_checkpoint`).

  Returns:
    (Transformer, tokenizer.Vocabulary, the step of the checkpoint loaded).
  """
  check_exists(model_dir)
  model_config = read_config(model_dir)
  paths = tokenizer.vocabulary_paths(model_dir, model_config.shared_vocab, src_lang,
                                     tgt_lang)
  for path in paths:
    if not tf.io.gfile.exists(path):
      raise ModelDirError(f"{path}: no such file (check --src_lang/--tgt_lang)")
  vocabulary = tokenizer.load_vocabulary(*paths)
  path = choose_checkpoint(model_dir, checkpoint)
  model = Transformer(**dataclasses.asdict(model_config))
  restore(tf.train.Checkpoint(model=model), path, partial=True)
  return model, vocabulary, checkpoint_step(path)
