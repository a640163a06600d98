"""A published Marian model (OPUS-MT's Hugging Face format) as a model directory of ours.

The folder holds config.json (MarianConfig), model.safetensors, source.spm, target.spm and
vocab.json (the pieces of both SentencePiece models in one id space). The weights are read with
safetensors' NumPy API, without PyTorch. The model becomes ours with the options that hold it
(config.ModelConfig: swish, attention and output biases, layer norm epsilon 1e-5, sines then
cosines), and its vocabulary a PieceTableTokenizer table (data_pipeline/piece_table.py).

Ids: ours keep PAD_ID, UNK_ID, BOS_ID and EOS_ID (data_pipeline/token_ids.py); Marian's </s>,
<unk> and <pad> move there, BOS_ID takes the embedding of Marian's decoder start token (its pad
id: Marian starts decoding from <pad>), and every other id i keeps its order from id 4 on. The
table thus has one entry more than vocab.json.
"""

import dataclasses
import json
import os

import numpy as np
import tensorflow as tf

from common import files
from common.errors import UserError
from data_pipeline import tokenizer
from data_pipeline.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tf_transformer import checkpoints
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import ModelConfig
from tf_transformer.model import build_model

# what a Marian folder must hold: the weights, the subword models, the joint vocabulary
WEIGHTS_FILE = "model.safetensors"
FILES = ("config.json", WEIGHTS_FILE, "source.spm", "target.spm", "vocab.json")
# Marian's activation_function -> ours (config.CHOICES["activation"])
_ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}


class MarianError(UserError):
  """A folder that is not a Marian model this project can hold; the message names the file."""


@dataclasses.dataclass(frozen=True)
class Ids:
  """Marian's decoder start id and our id of each of its ids."""
  decoder_start: int
  # ours[marian id]: our id of each Marian id
  ours: np.ndarray

  @property
  def marian_of_ours(self) -> np.ndarray:
    """int [V + 1]: the Marian id whose row each of our ids takes (BOS_ID: the decoder
    start's)."""
    rows = np.empty(len(self.ours) + 1, np.int64)
    rows[self.ours] = np.arange(len(self.ours))
    rows[BOS_ID] = self.decoder_start
    return rows


def _read_json(path: str) -> dict:
  try:
    with tf.io.gfile.GFile(path) as f:
      value = json.load(f)
  except (OSError, ValueError, tf.errors.OpError) as e:
    raise MarianError(f"{path}: unreadable ({e})") from None
  if not isinstance(value, dict):
    raise MarianError(f"{path}: not a JSON object")
  return value


def check_folder(folder: str) -> dict:
  """Refuses, in one line naming the file, a folder that is not a Marian model this project
  can hold; returns its config.json."""
  if not tf.io.gfile.isdir(folder):
    raise MarianError(f"{folder}: no such directory")
  if not tf.io.gfile.exists(os.path.join(folder, WEIGHTS_FILE)) and tf.io.gfile.exists(
      os.path.join(folder, "pytorch_model.bin")):
    raise MarianError(
        f"{folder}: holds pytorch_model.bin only; convert it to {WEIGHTS_FILE} first, e.g. with "
        "transformers: MarianMTModel.from_pretrained(folder).save_pretrained(folder, "
        "safe_serialization=True)")
  for name in FILES:
    if not tf.io.gfile.exists(os.path.join(folder, name)):
      raise MarianError(f"{os.path.join(folder, name)}: no such file (a Marian model folder "
                        f"holds {', '.join(FILES)})")
  path = os.path.join(folder, "config.json")
  config = _read_json(path)
  if config.get("model_type") != "marian":
    raise MarianError(f"{path}: model_type {config.get('model_type')!r} is not 'marian'")
  problems = []
  if config.get("normalize_before", False):
    problems.append("normalize_before=true (pre-norm layers)")
  if not config.get("static_position_embeddings", True):
    problems.append("learned position embeddings (static_position_embeddings=false)")
  if not config.get("share_encoder_decoder_embeddings", True):
    problems.append("separate source and target vocabularies "
                    "(share_encoder_decoder_embeddings=false)")
  if config.get("activation_function") not in _ACTIVATIONS:
    problems.append(f"activation_function={config.get('activation_function')!r}")
  for encoder, decoder in (("encoder_layers", "decoder_layers"),
                           ("encoder_attention_heads", "decoder_attention_heads"),
                           ("encoder_ffn_dim", "decoder_ffn_dim")):
    if config.get(encoder) != config.get(decoder):
      problems.append(f"{encoder}={config.get(encoder)} != {decoder}={config.get(decoder)}")
  if config.get("decoder_vocab_size", config.get("vocab_size")) != config.get("vocab_size"):
    problems.append("decoder_vocab_size != vocab_size")
  if problems:
    raise MarianError(f"{path}: an architecture this project cannot hold: "
                      f"{'; '.join(problems)}")
  return config


def _ids(config: dict, vocab: dict, vocab_path: str) -> Ids:
  size = config["vocab_size"]
  if len(vocab) != size or sorted(vocab.values()) != list(range(size)):
    raise MarianError(f"{vocab_path}: {len(vocab)} pieces, not config.json's vocab_size {size} "
                      f"(or ids that are not 0..{size - 1})")
  if "<unk>" not in vocab:
    raise MarianError(f"{vocab_path}: no <unk> piece")
  pad, eos = config["pad_token_id"], config["eos_token_id"]
  unk = vocab["<unk>"]
  ours = np.empty(size, np.int64)
  special = {pad: PAD_ID, unk: UNK_ID, eos: EOS_ID}
  others = [i for i in range(size) if i not in special]
  ours[others] = np.arange(len(others)) + 4
  for marian_id, our_id in special.items():
    ours[marian_id] = our_id
  return Ids(config.get("decoder_start_token_id", pad), ours)


def model_config(config: dict, vocab_size: int) -> ModelConfig:
  """Our ModelConfig of a Marian config.json (`vocab_size`: our table's)."""
  return ModelConfig(
      vocab_size, vocab_size, shared_vocab=True, num_layers=config["encoder_layers"],
      d_model=config["d_model"], num_heads=config["encoder_attention_heads"],
      d_ff=config["encoder_ffn_dim"], dropout_rate=float(config.get("dropout", 0.1)),
      attention_dropout_rate=float(config.get("attention_dropout", 0.0)),
      relu_dropout_rate=float(config.get("activation_dropout", 0.0)), norm_position="post",
      activation=_ACTIVATIONS[config["activation_function"]], projection_biases=True,
      layer_norm_epsilon=1e-5, output_bias=True, sinusoid_layout="halves",
      scale_embeddings=bool(config.get("scale_embedding", False)))


class _Weights:
  """The tensors of model.safetensors, each taken once, by name (with or without the
  "model." prefix transformers may write)."""

  def __init__(self, path: str):
    from safetensors.numpy import load_file

    self.path = path
    try:
      self.tensors = load_file(path)
    except Exception as e:  # noqa: BLE001 (safetensors raises its own kinds)
      raise MarianError(f"{path}: unreadable safetensors ({e})") from None

  def __call__(self, name: str, shape=None) -> np.ndarray:
    for key in (name, f"model.{name}", name.removeprefix("model.")):
      if key in self.tensors:
        value = np.asarray(self.tensors[key], np.float32)
        if shape is not None and value.shape != tuple(shape):
          raise MarianError(f"{self.path}: {key} has shape {list(value.shape)}, not "
                            f"{list(shape)}")
        return value
    raise MarianError(f"{self.path}: no tensor {name}")


def _linear(weights, name: str, d_in: int, d_out: int):
  """A torch Linear's weight [out, in] and bias -> our kernel [in, out] and bias."""
  return (weights(f"{name}.weight", (d_out, d_in)).T, weights(f"{name}.bias", (d_out,)))


def _attention(layer, weights, prefix: str, d: int):
  """Assigns an attention's projections (q, k, v, out) to our `layer`."""
  (q, q_b), (k, k_b), (v, v_b) = (_linear(weights, f"{prefix}.{part}_proj", d, d)
                                  for part in ("q", "k", "v"))
  out, out_b = _linear(weights, f"{prefix}.out_proj", d, d)
  if layer.self_attention:
    layer.qkv_kernel.assign(np.concatenate([q, k, v], axis=1))
    layer.qkv_bias.assign(np.concatenate([q_b, k_b, v_b]))
  else:
    layer.q_kernel.assign(q)
    layer.q_bias.assign(q_b)
    layer.kv_kernel.assign(np.concatenate([k, v], axis=1))
    layer.kv_bias.assign(np.concatenate([k_b, v_b]))
  layer.output_kernel.assign(out)
  layer.output_bias.assign(out_b)


def _norm(block, weights, name: str, d: int):
  block.norm.gamma.assign(weights(f"{name}.weight", (d,)))
  block.norm.beta.assign(weights(f"{name}.bias", (d,)))


def _feed_forward(ffn, weights, prefix: str, d: int, d_ff: int):
  for dense, name, d_in, d_out in ((ffn.inner, "fc1", d, d_ff), (ffn.outer, "fc2", d_ff, d)):
    kernel, bias = _linear(weights, f"{prefix}.{name}", d_in, d_out)
    dense.kernel.assign(kernel)
    dense.bias.assign(bias)


def load_weights(model, weights: _Weights, ids: Ids):
  """Assigns the Marian weights to our `model` (built with `model_config`)."""
  d, d_ff = model.d_model, model.stack_args["d_ff"]
  size = len(ids.ours)
  shared = weights("model.shared.weight", (size, d))
  model.target_embedding.embeddings.assign(shared[ids.marian_of_ours])
  if "lm_head.weight" in weights.tensors and not np.array_equal(
      weights("lm_head.weight", (size, d)), shared):
    raise MarianError(f"{weights.path}: lm_head.weight differs from model.shared.weight (an "
                      "untied output projection, which this project cannot hold)")
  bias = weights("final_logits_bias", (1, size))[0]
  model.target_embedding.output_bias.assign(bias[ids.marian_of_ours])
  for i, layer in enumerate(model.encoder.stack):
    prefix = f"model.encoder.layers.{i}"
    _attention(layer.self_attention, weights, f"{prefix}.self_attn", d)
    _norm(layer.attention_block, weights, f"{prefix}.self_attn_layer_norm", d)
    _feed_forward(layer.ffn, weights, prefix, d, d_ff)
    _norm(layer.ffn_block, weights, f"{prefix}.final_layer_norm", d)
  for i, layer in enumerate(model.decoder.stack):
    prefix = f"model.decoder.layers.{i}"
    _attention(layer.self_attention, weights, f"{prefix}.self_attn", d)
    _norm(layer.self_attention_block, weights, f"{prefix}.self_attn_layer_norm", d)
    _attention(layer.cross_attention, weights, f"{prefix}.encoder_attn", d)
    _norm(layer.cross_attention_block, weights, f"{prefix}.encoder_attn_layer_norm", d)
    _feed_forward(layer.ffn, weights, prefix, d, d_ff)
    _norm(layer.ffn_block, weights, f"{prefix}.final_layer_norm", d)


def pieces(vocab: dict, ids: Ids) -> list[str]:
  """Our table: the piece of each of our ids (the special ones ours: <pad>, <unk>, <s>,
  </s>)."""
  table = [""] * (len(ids.ours) + 1)
  for piece, marian_id in vocab.items():
    table[ids.ours[marian_id]] = piece
  table[PAD_ID], table[UNK_ID], table[BOS_ID], table[EOS_ID] = "<pad>", "<unk>", "<s>", "</s>"
  return table


def import_model(folder: str, model_dir: str) -> str:
  """Writes the Marian model of `folder` as the model directory `model_dir` (which must not
  hold a model yet): config.json, data.json, spm.source.model, spm.target.model,
  vocab.pieces.json, a checkpoint (ckpt-1) and final.json naming it. Returns the checkpoint's
  path.

  Raises:
    MarianError: the folder is not a Marian model this project can hold (one line naming the
      file and the problem).
    ModelDirError: `model_dir` already holds a model.
  """
  config = check_folder(folder)
  vocab_path = os.path.join(folder, "vocab.json")
  ids = _ids(config, _read_json(vocab_path), vocab_path)
  table = pieces(_read_json(vocab_path), ids)
  our_config = model_config(config, len(table))
  weights = _Weights(os.path.join(folder, WEIGHTS_FILE))
  model = build_model(our_config)
  load_weights(model, weights, ids)

  model_dir_lib.ensure_directory(model_dir)
  if tf.io.gfile.exists(os.path.join(model_dir, "config.json")):
    raise model_dir_lib.ModelDirError(f"{model_dir}: already holds a model; import into a new "
                                      "{model_dir:name}", model_dir=None)
  for name, ours in (("source.spm", tokenizer.SOURCE_MODEL_FILE),
                     ("target.spm", tokenizer.TARGET_MODEL_FILE)):
    with files.atomic_path(os.path.join(model_dir, ours)) as temporary:
      tf.io.gfile.copy(os.path.join(folder, name), temporary, overwrite=True)
  model_dir_lib.write_json(os.path.join(model_dir, tokenizer.PIECE_TABLE_FILE), table)
  # the languages OPUS-MT's tokenizer_config.json names, if it is there
  languages = {}
  if tf.io.gfile.exists(os.path.join(folder, "tokenizer_config.json")):
    languages = _read_json(os.path.join(folder, "tokenizer_config.json"))
  model_dir_lib.write_json(os.path.join(model_dir, "data.json"), {
      "src_lang": languages.get("source_lang") or "src",
      "tgt_lang": languages.get("target_lang") or "tgt", "vocab_size": len(table),
      "spm_model_type": "unigram", "spm_byte_fallback": False, "shared_vocab": True})
  model_dir_lib.check_config(model_dir, our_config)
  path = tf.train.Checkpoint(model=model).save(os.path.join(model_dir, "ckpt"))
  # the weights every tool loads by default ("final"), as a trained run's choice
  model_dir_lib.write_json(os.path.join(model_dir, checkpoints.FINAL_FILE), {
      "choice": "imported", "checkpoint": os.path.relpath(path, model_dir), "step": 0,
      "dev_bleu": {}, "imported_from": folder})
  return path
