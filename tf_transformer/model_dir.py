"""What a model directory holds: the architecture (config.json), subword models, checkpoints."""

import dataclasses
import glob
import json
import os
import re
import shutil

import tensorflow as tf

from data_pipeline import tokenizer
from tf_transformer.config import ModelConfig
from tf_transformer.console import UserError
from tf_transformer.model import Transformer


class ModelDirError(UserError):
  """A model directory or checkpoint problem, in one line that names the path."""


def write_json(path: str, value):
  """Writes `value` as JSON into a temporary file renamed over `path`: a reader (or a run
  killed mid-write) sees the old file or the new one, never half of one."""
  temporary = f"{path}.tmp-{os.getpid()}"
  try:
    with open(temporary, "w", encoding="utf-8") as f:
      json.dump(value, f, indent=2)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)


def check_recorded(path: str, current: dict, what: str):
  """Records `current` in the JSON file `path` at the first run; refuses a later run whose
  values differ, naming every differing field with both values."""
  if not os.path.exists(path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
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
  if os.path.exists(model_dir) and not os.path.isdir(model_dir):
    raise ModelDirError(f"{model_dir}: not a directory (--model_dir names a folder)")
  os.makedirs(model_dir, exist_ok=True)


def latest_checkpoint(folder: str) -> str | None:
  """The newest complete checkpoint of `folder`, None if it has none yet; a ModelDirError if
  its `checkpoint` state file names none that exists (TensorFlow would only log that)."""
  state = os.path.join(folder, "checkpoint")
  latest = tf.train.latest_checkpoint(folder)
  if latest is None and os.path.exists(state):
    raise ModelDirError(f"{state}: names no readable checkpoint (a corrupt file, or its "
                        "checkpoints are gone); delete it and the checkpoints it named, or use "
                        "another --model_dir")
  return latest


def check_config(model_dir: str, model_config: ModelConfig):
  """Records the architecture at the first run; refuses a later run with another one."""
  check_recorded(os.path.join(model_dir, "config.json"), dataclasses.asdict(model_config),
                 "the architecture")


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
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (OSError, ValueError) as e:
    raise ModelDirError(f"{path}: unreadable ({e}); use another --model_dir") from None
  if not isinstance(value, dict):
    raise ModelDirError(f"{path}: not a JSON object; use another --model_dir")
  return value


def remove_partial_saves(folder: str):
  """Deletes what a killed checkpoint save left in `folder`: its `<prefix>-N_temp` folder
  and the files of a checkpoint newer than the last one recorded as complete."""
  for temporary in glob.glob(os.path.join(folder, "*_temp")):
    shutil.rmtree(temporary, ignore_errors=True)
  for temporary in glob.glob(os.path.join(folder, "*.tmp-*")):
    os.remove(temporary)
  latest = latest_checkpoint(folder)
  newest = int(latest.rsplit("-", 1)[1]) if latest else -1
  for path in glob.glob(os.path.join(folder, "ckpt-*")):
    match = re.fullmatch(r"ckpt-(\d+)\.(index|data-\d+-of-\d+)", os.path.basename(path))
    if match and int(match.group(1)) > newest:
      os.remove(path)


def read_config(model_dir: str) -> ModelConfig:
  path = os.path.join(model_dir, "config.json")
  if not os.path.exists(path):
    raise ModelDirError(f"{path}: no such file; is {model_dir} a trained model directory?")
  try:
    return ModelConfig(**_read_json(path))
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


def load_for_inference(model_dir: str, src_lang: str, tgt_lang: str):
  """The trained model at its best checkpoint (by dev BLEU; else the latest) and its vocabulary.

  Returns:
    (Transformer, tokenizer.Vocabulary, checkpoint step).
  """
  if not os.path.exists(model_dir):
    raise ModelDirError(f"{model_dir}: no such directory")
  if not os.path.isdir(model_dir):
    raise ModelDirError(f"{model_dir}: not a directory (--model_dir names a folder)")
  model_config = read_config(model_dir)
  paths = tokenizer.vocabulary_paths(model_dir, model_config.shared_vocab, src_lang,
                                     tgt_lang)
  for path in paths:
    if not os.path.exists(path):
      raise ModelDirError(f"{path}: no such file (check --src_lang/--tgt_lang)")
  vocabulary = tokenizer.load_vocabulary(*paths)
  path = (latest_checkpoint(os.path.join(model_dir, "best")) or latest_checkpoint(model_dir))
  if not path:
    raise ModelDirError(f"{model_dir}: no checkpoint to load")
  model = Transformer(**dataclasses.asdict(model_config))
  restore(tf.train.Checkpoint(model=model), path, partial=True)
  return model, vocabulary, int(path.rsplit("-", 1)[1])
