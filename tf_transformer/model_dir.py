"""A model directory's JSON records: the architecture (config.json), what the vocabulary and
the optimizer state depend on (data.json, optimizer.json), each checked against a rerun's flags.

Checkpoints, and loading a model for inference, are `checkpoints.py`'s. Every
file operation goes through tf.io.gfile, so a model directory may be on any TensorFlow file
system (gs://, file://, a local path).
"""

import dataclasses
import json
import os

import tensorflow as tf

from common import files
from common.errors import UserError
from tf_transformer.config import ModelConfig


class ModelDirError(UserError):
  """A model directory or checkpoint problem, in one line that names the path."""


def write_json(path: str, value):
  """Writes `value` as JSON to `path`: a reader (or a run killed mid-write) sees the old file
  or the new one, never half of one."""
  with files.atomic_file(path) as f:
    json.dump(value, f, indent=2)


def check_recorded(path: str, current: dict, what: str, **fields):
  """Records `current` in the JSON file `path` at the first run; refuses a later run whose
  values differ, naming every differing field with both values (`what`: why they matter, a
  message template naming `fields`, as common.errors.UserError's)."""
  if not tf.io.gfile.exists(path):
    tf.io.gfile.makedirs(os.path.dirname(path) or ".")
    write_json(path, current)
    return
  recorded = read_json(path)
  differing = [key for key in sorted(set(recorded) | set(current))
               if recorded.get(key) != current.get(key)]
  if differing:
    was = ", ".join(f"{key}={recorded.get(key)!r}" for key in differing)
    now = ", ".join(f"{key}={current.get(key)!r}" for key in differing)
    raise ModelDirError(f"{path}: this model was created with {was}; the settings now give "
                        f"{now} ({what}); use the same settings or another {{model_dir:name}}",
                        model_dir=None, **fields)


def ensure_directory(model_dir: str):
  """Creates `model_dir` if needed; a file in its place is a ModelDirError."""
  if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
    raise ModelDirError(f"{model_dir}: not a directory ({{model_dir:name}} names a folder)",
                        model_dir=None)
  try:
    tf.io.gfile.makedirs(model_dir)
  except tf.errors.FailedPreconditionError:  # its message names the file on the way, not model_dir
    raise ModelDirError(f"{model_dir}: Not a directory") from None


# config.json keys of earlier releases -> their names now
_RENAMED_CONFIG_KEYS = {"padding_aware_ffn": "skip_padding"}


# config.json keys added since, with the value every model recorded before had
_ADDED_CONFIG_KEYS = {"position_encoding": "sinusoidal", "max_relative_position": 0,
                      "activation": "relu", "projection_biases": False,
                      "layer_norm_epsilon": 1e-6, "output_bias": False,
                      "sinusoid_layout": "interleaved", "scale_embeddings": True}


def _upgraded_config(recorded: dict) -> dict:
  renamed = {_RENAMED_CONFIG_KEYS.get(key, key): value for key, value in recorded.items()}
  return {**_ADDED_CONFIG_KEYS, **renamed}


def _upgrade(path: str, upgraded):
  """Rewrites the JSON record `path`, if there is one, as `upgraded` (fn(record) -> record)
  brings a record of an earlier release up to date."""
  if tf.io.gfile.exists(path):
    recorded = read_json(path)
    if upgraded(recorded) != recorded:
      write_json(path, upgraded(recorded))


def check_config(model_dir: str, model_config: ModelConfig):
  """Records the architecture at the first run; refuses a later run with another one."""
  path = os.path.join(model_dir, "config.json")
  _upgrade(path, _upgraded_config)
  check_recorded(path, dataclasses.asdict(model_config), "the architecture")


def check_optimizer(model_dir: str, train_config):
  """Records what the optimizer's part of a checkpoint holds besides Adam's moments (Keras
  numbers its variables, so a moving average or a loss scale shifts every later one); refuses
  a rerun that would read the checkpoints with another layout."""
  c = train_config
  check_recorded(os.path.join(model_dir, "optimizer.json"),
                 {"moving_average": c.ema_decay > 0,
                  "loss_scaling": c.mixed_precision == "mixed_float16"},
                 "the optimizer state in the checkpoints: {ema_decay:name} on or off, "
                 "{mixed_precision:name}=mixed_float16 or not", ema_decay=None,
                 mixed_precision=None)


# data.json keys added since, with the value every model recorded before had
_ADDED_DATA_KEYS = {"spm_byte_fallback": False}


def _upgraded_data(recorded: dict) -> dict:
  return {**_ADDED_DATA_KEYS, **recorded}


def check_data(model_dir: str, data_config):
  """Records what the subword models and the checkpoints depend on (languages, vocabulary
  size and type, byte fallback, shared or not) before any is built; refuses a later run with
  others once a subword model is there."""
  c = data_config
  path = os.path.join(model_dir, "data.json")
  if not tf.io.gfile.glob(os.path.join(model_dir, "spm.*.model")):
    # the run that recorded it stopped before its subword models (a flag it was refused for,
    # such as too small a vocab_size): nothing depends on the record yet
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
  _upgrade(path, _upgraded_data)
  check_recorded(path,
                 {"src_lang": c.src_lang, "tgt_lang": c.tgt_lang, "vocab_size": c.vocab_size,
                  "spm_model_type": c.spm_model_type, "spm_byte_fallback": c.spm_byte_fallback,
                  "shared_vocab": c.shared_vocab},
                 "the vocabulary")


def read_data(model_dir: str) -> dict:
  """data.json's record (src_lang, tgt_lang, vocabulary settings), or {} when there is none."""
  path = os.path.join(model_dir, "data.json")
  return _upgraded_data(read_json(path)) if tf.io.gfile.exists(path) else {}


def read_json(path: str) -> dict:
  """The JSON object of `path`, or a ModelDirError naming it."""
  try:
    with tf.io.gfile.GFile(path) as f:
      value = json.load(f)
  except (OSError, ValueError, tf.errors.OpError) as e:
    raise ModelDirError(f"{path}: unreadable ({e}); use another {{model_dir:name}}",
                        model_dir=None) from None
  if not isinstance(value, dict):
    raise ModelDirError(f"{path}: not a JSON object; use another {{model_dir:name}}",
                        model_dir=None)
  return value


def read_config(model_dir: str) -> ModelConfig:
  path = os.path.join(model_dir, "config.json")
  if not tf.io.gfile.exists(path):
    raise ModelDirError(f"{path}: no such file; is {model_dir} a trained model directory?")
  try:
    return ModelConfig(**_upgraded_config(read_json(path)))
  except TypeError as e:
    raise ModelDirError(f"{path}: not this project's model config ({e}); use another "
                        "{model_dir:name}", model_dir=None) from None


def check_exists(model_dir: str):
  """Raises ModelDirError unless `model_dir` is an existing folder."""
  if not tf.io.gfile.exists(model_dir):
    raise ModelDirError(f"{model_dir}: no such directory")
  if not tf.io.gfile.isdir(model_dir):
    raise ModelDirError(f"{model_dir}: not a directory ({{model_dir:name}} names a folder)",
                        model_dir=None)


