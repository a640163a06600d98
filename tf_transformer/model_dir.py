"""What a model directory holds: the architecture (config.json), subword models, checkpoints."""

import dataclasses
import json
import os

import tensorflow as tf

from data_pipeline import tokenizer
from tf_transformer.config import ModelConfig
from tf_transformer.model import Transformer


class ModelDirError(RuntimeError):
  """A model directory or checkpoint problem, in one line that names the path."""


def check_config(model_dir: str, model_config: ModelConfig):
  """Records the architecture at the first run; refuses a later run with another one."""
  path = os.path.join(model_dir, "config.json")
  current = dataclasses.asdict(model_config)
  if not os.path.exists(path):
    os.makedirs(model_dir, exist_ok=True)
    with open(path, "w") as f:
      json.dump(current, f, indent=2)
    return
  for key, value in read_config(model_dir).__dict__.items():
    if current.get(key) != value:
      raise ModelDirError(
          f"{path}: this model was created with {key}={value!r}, the flags now give "
          f"{current.get(key)!r}; use the same flags or another --model_dir")


def read_config(model_dir: str) -> ModelConfig:
  path = os.path.join(model_dir, "config.json")
  try:
    with open(path) as f:
      return ModelConfig(**json.load(f))
  except FileNotFoundError:
    raise ModelDirError(f"{path}: no such file; is {model_dir} a trained model "
                        "directory?") from None
  except (OSError, ValueError, TypeError) as e:
    raise ModelDirError(f"{path}: unreadable ({e}); use another --model_dir") from None


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
  if not os.path.isdir(model_dir):
    raise ModelDirError(f"{model_dir}: no such directory")
  model_config = read_config(model_dir)
  paths = tokenizer.vocabulary_paths(model_dir, model_config.shared_vocab, src_lang,
                                     tgt_lang)
  for path in paths:
    if not os.path.exists(path):
      raise ModelDirError(f"{path}: no such file (check --src_lang/--tgt_lang)")
  vocabulary = tokenizer.load_vocabulary(*paths)
  path = (tf.train.latest_checkpoint(os.path.join(model_dir, "best")) or
          tf.train.latest_checkpoint(model_dir))
  if not path:
    raise ModelDirError(f"{model_dir}: no checkpoint to load")
  model = Transformer(**dataclasses.asdict(model_config))
  restore(tf.train.Checkpoint(model=model), path, partial=True)
  return model, vocabulary, int(path.rsplit("-", 1)[1])
