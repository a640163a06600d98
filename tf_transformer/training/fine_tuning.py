"""A run that starts from another model's weights (`init_from=OLD`): fine-tuning.

The new run keeps OLD's architecture and subword model(s), so the new data is read with OLD's
pieces; or, with a vocabulary update (`update_vocab`), it trains subword models of its own on
the new data and maps OLD's embeddings onto them (`remap_rows`). It starts its own step count,
optimizer moments and learning-rate schedule (from step 0: a warm-up to the peak, then the
inverse square root), and records where it started in `init.json`. Once the new model directory
has a checkpoint, a rerun resumes it and never reads OLD again.
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf
from absl import logging

from common import files
from data_pipeline import tokenizer
from tf_transformer import checkpoints
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import ConfigError, ModelConfig
from tf_transformer.model import build_model

INIT_FILE = "init.json"
# the ModelConfig fields that shape the weights; the dropout rates and skip_padding may change
ARCHITECTURE = ("num_layers", "d_model", "num_heads", "d_ff", "norm_position", "shared_vocab",
                "position_encoding", "max_relative_position", "activation",
                "projection_biases", "layer_norm_epsilon", "output_bias", "sinusoid_layout",
                "scale_embeddings")
# the data settings that made OLD's subword models
VOCABULARY = ("vocab_size", "spm_model_type", "spm_byte_fallback", "shared_vocab")


@dataclasses.dataclass(frozen=True)
class Start:
  """Where a fine-tuning run starts.

  Attributes:
    init_from: OLD's model directory.
    checkpoint: the checkpoint of OLD whose weights the run starts from.
    step: that checkpoint's step in OLD's run.
  """
  init_from: str
  checkpoint: str
  step: int
  # with a vocabulary update: OLD's pieces, in id order, of the source and the target side
  old_pieces: tuple[tuple[str, ...], tuple[str, ...]] | None = None


def check_settings(init_from: str, given: dict, data_config, update_vocab: bool = False):
  """Refuses a setting given for the new run that contradicts OLD's architecture or vocabulary.

  Args:
    init_from: OLD's model directory.
    given: {name: value} of the ARCHITECTURE and VOCABULARY settings the user gave for the new
      run (the tools: the flags set on the command line or in a flagfile).
    data_config: the new run's DataConfig.
    update_vocab: the new run trains its own subword models (its own vocabulary settings, but
      OLD's `shared_vocab`: one embedding matrix or two).

  Returns:
    `data_config` with OLD's vocabulary settings (with `update_vocab`, OLD's shared_vocab).

  Raises:
    ConfigError: naming the setting, its value and OLD's.
  """
  old_config = dataclasses.asdict(model_dir_lib.read_config(init_from))
  old_data = model_dir_lib.read_data(init_from)
  vocabulary_names = ("shared_vocab",) if update_vocab else VOCABULARY
  recorded = {**{name: old_config[name] for name in ARCHITECTURE},
              **{name: old_data[name] for name in vocabulary_names if name in old_data}}
  for name, old_value in recorded.items():
    if name in given and given[name] != old_value:
      raise ConfigError(f"{{{name}}} contradicts the model of {{init_from}} ({name}="
                        f"{old_value}): fine-tuning keeps its architecture and vocabulary; "
                        "drop it", **{name: given[name], "init_from": init_from})
  vocabulary = {name: value for name, value in recorded.items() if name in vocabulary_names}
  return dataclasses.replace(data_config, **vocabulary)


def copy_vocabulary(init_from: str, model_dir: str, data_config):
  """Copies OLD's subword model(s) into the new model directory, where the data pipeline then
  reuses them instead of training its own (only when they are not there yet)."""
  c = data_config
  table = os.path.join(init_from, tokenizer.PIECE_TABLE_FILE)  # an imported model's
  new_table = os.path.join(model_dir, tokenizer.PIECE_TABLE_FILE)
  if tf.io.gfile.exists(table) and not tf.io.gfile.exists(new_table):
    with files.atomic_path(new_table) as temporary:
      tf.io.gfile.copy(table, temporary)
  old_paths = tokenizer.vocabulary_paths(init_from, c.shared_vocab, c.src_lang, c.tgt_lang)
  new_paths = tokenizer.vocabulary_paths(model_dir, c.shared_vocab, c.src_lang, c.tgt_lang)
  for old, new in zip(old_paths, new_paths):
    if not tf.io.gfile.exists(old):
      raise model_dir_lib.ModelDirError(
          f"{old}: no such file: {{init_from:name}}'s subword model for these languages "
          "({src_lang} {tgt_lang})", init_from=None, src_lang=c.src_lang, tgt_lang=c.tgt_lang)
    if not tf.io.gfile.exists(new):
      with files.atomic_path(new) as temporary:
        tf.io.gfile.copy(old, temporary)


def origin(model_dir: str, init_from: str | None) -> str | None:
  """Whose architecture and vocabulary a run in `model_dir` takes: OLD's (`init_from`) at the
  first run; its own once it has a checkpoint and started from another model (a resumed
  fine-tuning, which never reads OLD again); None for a run trained from scratch.

  Raises:
    ConfigError: `init_from` names a model for a model directory that holds a run trained
      from scratch.
  """
  resumed = tf.io.gfile.exists(model_dir) and checkpoints.latest_checkpoint(model_dir)
  if not resumed:
    if init_from:
      model_dir_lib.check_exists(init_from)
    return init_from or None
  if tf.io.gfile.exists(os.path.join(model_dir, INIT_FILE)):
    return model_dir
  if init_from:
    raise ConfigError(f"{{init_from}}: {model_dir} already holds a run trained from scratch; "
                      "fine-tune into a new model directory", init_from=init_from)
  return None


def model_config(origin_dir: str, settings: dict, vocabulary=None) -> ModelConfig:
  """`origin_dir`'s architecture with the new run's dropout rates and skip_padding, from
  `settings` ({ModelConfig field: value}; the architecture's fields in it are not read), and
  with a vocabulary update the sizes of the new `vocabulary` (a tokenizer.Vocabulary)."""
  changeable = {field.name: settings[field.name] for field in dataclasses.fields(ModelConfig)
                if field.name not in ARCHITECTURE and field.name in settings}
  if vocabulary is not None:
    changeable.update(source_vocab_size=vocabulary.source_size,
                      target_vocab_size=vocabulary.target_size)
  return dataclasses.replace(model_dir_lib.read_config(origin_dir), **changeable)


def start(init_from: str, checkpoint: str, model_dir: str, record: bool = True,
          update_vocab: bool = False, src_lang: str = "", tgt_lang: str = "") -> Start:
  """The weights a first run in `model_dir` starts from: OLD's at
  `checkpoint` (checkpoints.choose_checkpoint's choices), recorded in model_dir/init.json
  when `record` (the chief worker); with `update_vocab`, OLD's pieces too (of its subword
  models for `src_lang` and `tgt_lang`)."""
  path = checkpoints.choose_checkpoint(init_from, checkpoint)
  old_pieces = None
  if update_vocab:
    old_config = model_dir_lib.read_config(init_from)
    vocabulary = tokenizer.load_vocabulary(*tokenizer.vocabulary_paths(
        init_from, old_config.shared_vocab, src_lang, tgt_lang))
    old_pieces = (tokenizer.pieces(vocabulary.source), tokenizer.pieces(vocabulary.target))
  result = Start(init_from, path, checkpoints.checkpoint_step(path), old_pieces)
  if record:
    model_dir_lib.write_json(os.path.join(model_dir, INIT_FILE),
                             {"init_from": init_from, "checkpoint": path, "step": result.step,
                              "update_vocab": update_vocab})
  return result


def remap_rows(old_rows, old_pieces, new_pieces):
  """Rows of a new vocabulary from an old one's: a piece of both keeps its old row; a new piece
  starts from the mean of the old rows (of the real pieces, the first four, PAD, UNK, BOS and
  EOS, left out): the point of the embedding space a model has seen most of, where a new
  piece's logit starts close to the others' and its embedding does not stand out.

  Args:
    old_rows: [old vocabulary, ...] (an embedding matrix or an output bias).
    old_pieces, new_pieces: each vocabulary's pieces, in id order.

  Returns:
    (rows [new vocabulary, ...], how many pieces kept their rows).
  """
  old_rows = np.asarray(old_rows)
  index = {piece: i for i, piece in enumerate(old_pieces)}
  mean = old_rows[4:].mean(axis=0) if len(old_rows) > 4 else old_rows.mean(axis=0)
  rows = np.stack([old_rows[index[piece]] if piece in index else mean
                   for piece in new_pieces]).astype(old_rows.dtype)
  return rows, sum(piece in index for piece in new_pieces)


def load_weights(model, start_point: Start, vocabulary=None):
  """Restores OLD's model weights into `model` (built with `model_config(OLD, ...)`); the
  optimizer, step and data position stay the new run's. With a vocabulary update
  (`start_point.old_pieces`; `model` of the new `vocabulary`'s sizes, a tokenizer.Vocabulary)
  the embeddings and the output bias are `remap_rows` of OLD's onto the new pieces."""
  if start_point.old_pieces is None:
    checkpoints.restore(tf.train.Checkpoint(model=model), start_point.checkpoint,
                        partial=True)
    return
  old_config = model_dir_lib.read_config(start_point.init_from)
  old = build_model(dataclasses.replace(old_config, dropout_rate=0.0))
  checkpoints.restore(tf.train.Checkpoint(model=old), start_point.checkpoint, partial=True)
  old_source, old_target = start_point.old_pieces
  new_source, new_target = (tokenizer.pieces(vocabulary.source),
                            tokenizer.pieces(vocabulary.target))
  by_piece = {id(model.target_embedding.embeddings), id(model.source_embedding.embeddings)}
  if model.embedding_args["output_bias"]:
    by_piece.add(id(model.target_embedding.output_bias))
  for variable, old_variable in zip(model.weights, old.weights):
    if id(variable) not in by_piece:  # of the same shape: the architecture is OLD's
      variable.assign(old_variable)
      continue
    source_side = "source_embedding" in variable.path
    rows, kept = remap_rows(old_variable.numpy(), old_source if source_side else old_target,
                            new_source if source_side else new_target)
    variable.assign(rows)
    logging.info("%s: %d of %d pieces keep their rows; the other %d start from the mean",
                 variable.path, kept, len(rows), len(rows) - kept)
