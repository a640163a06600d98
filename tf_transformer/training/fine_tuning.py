"""A run that starts from another model's weights (`init_from=OLD`): fine-tuning.

The new run keeps OLD's architecture and subword model(s): the vocabulary cannot change under
trained embeddings, so the new data is read with OLD's pieces. It starts its own step count,
optimizer moments and learning-rate schedule (from step 0: a warm-up to the peak, then the
inverse square root), and records where it started in `init.json`. Once the new model directory
has a checkpoint, a rerun resumes it and never reads OLD again.
"""

import dataclasses
import os

import tensorflow as tf

from common import files
from data_pipeline import tokenizer
from tf_transformer import checkpoints
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import ConfigError, ModelConfig

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


def check_settings(init_from: str, given: dict, data_config):
  """Refuses a setting given for the new run that contradicts OLD's architecture or vocabulary.

  Args:
    init_from: OLD's model directory.
    given: {name: value} of the ARCHITECTURE and VOCABULARY settings the user gave for the new
      run (the tools: the flags set on the command line or in a flagfile).
    data_config: the new run's DataConfig.

  Returns:
    `data_config` with OLD's vocabulary settings.

  Raises:
    ConfigError: naming the setting, its value and OLD's.
  """
  old_config = dataclasses.asdict(model_dir_lib.read_config(init_from))
  old_data = model_dir_lib.read_data(init_from)
  recorded = {**{name: old_config[name] for name in ARCHITECTURE},
              **{name: old_data[name] for name in VOCABULARY if name in old_data}}
  for name, old_value in recorded.items():
    if name in given and given[name] != old_value:
      raise ConfigError(f"{{{name}}} contradicts the model of {{init_from}} ({name}="
                        f"{old_value}): fine-tuning keeps its architecture and vocabulary; "
                        "drop it", **{name: given[name], "init_from": init_from})
  vocabulary = {name: value for name, value in recorded.items() if name in VOCABULARY}
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


def model_config(origin_dir: str, settings: dict) -> ModelConfig:
  """`origin_dir`'s architecture with the new run's dropout rates and skip_padding, from
  `settings` ({ModelConfig field: value}; the architecture's fields in it are not read)."""
  changeable = {field.name: settings[field.name] for field in dataclasses.fields(ModelConfig)
                if field.name not in ARCHITECTURE and field.name in settings}
  return dataclasses.replace(model_dir_lib.read_config(origin_dir), **changeable)


def start(init_from: str, checkpoint: str, model_dir: str, record: bool = True) -> Start:
  """The weights a first run in `model_dir` starts from: OLD's at
  `checkpoint` (checkpoints.choose_checkpoint's choices), recorded in model_dir/init.json
  when `record` (the chief worker)."""
  path = checkpoints.choose_checkpoint(init_from, checkpoint)
  result = Start(init_from, path, checkpoints.checkpoint_step(path))
  if record:
    model_dir_lib.write_json(os.path.join(model_dir, INIT_FILE),
                             {"init_from": init_from, "checkpoint": path, "step": result.step})
  return result


def load_weights(model, start_point: Start):
  """Restores OLD's model weights into `model` (built with `model_config(OLD, ...)`); the
  optimizer, step and data position stay the new run's."""
  checkpoints.restore(tf.train.Checkpoint(model=model), start_point.checkpoint, partial=True)
