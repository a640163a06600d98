"""SentencePiece subword models: trained with `sentencepiece`, applied in-graph by tf-text.

The same .model file serves the training pipeline and the exported SavedModel, whose
`tensorflow_text.SentencepieceTokenizer` op TF Serving links. The .model files are read and
written through tf.io.gfile, so a model directory may be on any TensorFlow file system (gs://).
"""

import dataclasses
import hashlib
import json
import os
import re
import tempfile
import time
from typing import Iterable

import tensorflow as tf
import tensorflow_text as tf_text
from absl import logging
from tensorflow_text.python.ops.sentencepiece_tokenizer import gen_sentencepiece_tokenizer

from common import files
from common.errors import UserError
from common.progress import ProgressBar
from data_pipeline import language_tags
from data_pipeline.piece_table import PieceTableTokenizer
from data_pipeline.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class VocabularyError(UserError, ValueError):
  """A subword model that cannot be trained with the flags given."""


def train_sentencepiece(sentences: Iterable[str], model_path: str, vocab_size: int,
                        model_type: str = "unigram", input_sentence_size: int = 2_000_000,
                        symbols: tuple[str, ...] = (), byte_fallback: bool = False):
  """Trains a SentencePiece model on `sentences` and writes it to `model_path` atomically.

  Ids: 0 <pad>, 1 <unk>, 2 <s> (BOS), 3 </s> (EOS), then `symbols`. The vocabulary may come
  out smaller than `vocab_size` on a small corpus instead of failing.

  Args:
    model_path: where the .model file goes, on any TensorFlow file system.
    vocab_size: the pieces wanted; at least those SentencePiece keeps whole (every character
      of 99.95% of the text's, the special pieces, `symbols` and with `byte_fallback` 256
      bytes), else a VocabularyError says how many.
    symbols: pieces that the text "<symbol>" always segments into, whole (a multilingual
      model's target-language tokens).
    byte_fallback: a character the model does not keep becomes its UTF-8 bytes, pieces
      <0x00>..<0xFF>, instead of <unk> (tf-text's detokenizer joins them again, and writes
      U+FFFD for a byte sequence that is not UTF-8).
  """
  import sentencepiece as spm  # training only; encoding happens in-graph with tf-text

  tf.io.gfile.makedirs(os.path.dirname(model_path) or ".")
  # SentencePiece writes local files only: it trains in a local folder, then the model is
  # copied next to `model_path` under a temporary name renamed over it
  with tempfile.TemporaryDirectory() as tmp:
    prefix = os.path.join(tmp, "spm")
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=vocab_size,
          model_type=model_type, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
          input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
          character_coverage=0.9995, hard_vocab_limit=False, minloglevel=2,
          user_defined_symbols=list(symbols), byte_fallback=byte_fallback,
          num_threads=os.cpu_count() or 1)
    except RuntimeError as e:
      needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(e))
      if not needed:
        raise
      raise VocabularyError(
          f"{{vocab_size}} is too small for {model_path}: SentencePiece keeps "
          f"{needed.group(1)} pieces whole (the text's characters, the special pieces"
          f"{', the 256 bytes of {spm_byte_fallback:name}' if byte_fallback else ''}); give "
          f"{{vocab_size:name}}={needed.group(1)} or more", vocab_size=vocab_size,
          spm_byte_fallback=None) from None
    with files.atomic_path(model_path) as temporary:
      tf.io.gfile.copy(prefix + ".model", temporary, overwrite=True)


def load_tokenizer(model_path: str, alpha: float = 0.0, nbest_size: int = -1,
                   out_type=tf.int32) -> tf_text.SentencepieceTokenizer:
  """The in-graph tokenizer of a SentencePiece model file (ids as int32, or pieces with
  `out_type` tf.string): the best segmentation, or with `alpha` > 0 one sampled anew at each
  call (see Vocabulary.sampling)."""
  with tf.io.gfile.GFile(model_path, "rb") as f:
    model = f.read()
  if alpha > 0:
    tokenizer = tf_text.SentencepieceTokenizer(model=model, out_type=out_type, alpha=alpha,
                                               nbest_size=nbest_size)
  else:
    tokenizer = tf_text.SentencepieceTokenizer(model=model, out_type=out_type)
  tokenizer._model_resource = _NamedSentencepieceModel(model)  # pylint: disable=protected-access
  return tokenizer


class _NamedSentencepieceModel(tf.saved_model.experimental.TrackableResource):
  """A SentencePiece model's resource, named after the model's bytes.

  tf-text's own resource belongs to the eager kernel that created it, and TensorFlow drops
  that kernel whenever it clears its kernel cache, as `tf.random.set_seed` and
  `keras.utils.set_random_seed` do: a vocabulary loaded before a program seeds TensorFlow would
  fail at its next use. A named resource outlives its kernel; tokenizers of the same bytes share
  it, as they safely may.
  """

  def __init__(self, model: bytes):
    super().__init__()
    self._model = model
    self._shared_name = "sentencepiece_" + hashlib.sha256(model).hexdigest()
    _ = self.resource_handle  # creates the resource now, outside any tf.function

  def _create_resource(self):
    return gen_sentencepiece_tokenizer.sentencepiece_op(model=self._model,
                                                        shared_name=self._shared_name)


# An imported model's vocabulary (bin/import_marian.py): its source and target SentencePiece
# models, whose pieces take their ids from one joint table (piece_table.py), a JSON list of the
# pieces in id order
PIECE_TABLE_FILE = "vocab.pieces.json"
SOURCE_MODEL_FILE, TARGET_MODEL_FILE = "spm.source.model", "spm.target.model"


@dataclasses.dataclass(frozen=True)
class Vocabulary:
  """The subword models of a translation direction (the same file twice when joint); with
  `pieces`, the joint table of an imported model's two models (piece_table.py)."""
  source_model_path: str
  target_model_path: str
  source: tf_text.SentencepieceTokenizer | PieceTableTokenizer
  target: tf_text.SentencepieceTokenizer | PieceTableTokenizer
  pieces: tuple[str, ...] = ()

  @property
  def source_size(self) -> int:
    return int(self.source.vocab_size())

  @property
  def target_size(self) -> int:
    return int(self.target.vocab_size())

  def sampling(self, alpha: float, nbest_size: int = -1, sides: str = "both") -> "Vocabulary":
    """These subword models segmenting by sampling (subword regularization, Kudo 2018): each
    call draws a segmentation among the `nbest_size` best (-1: all) with probabilities
    P(segmentation)^alpha; a BPE model drops each merge with probability `alpha` instead.
    Only the `sides` ("both", "source" or "target") sample; the other keeps these tokenizers.
    SentencePiece draws with its own random generator, which TensorFlow does not seed."""
    source, target = self.source, self.target
    if sides != "target":
      source = _load(self.source_model_path, self.pieces, alpha, nbest_size)
    if sides != "source":
      shared = sides == "both" and self.target_model_path == self.source_model_path
      target = source if shared else _load(self.target_model_path, self.pieces, alpha,
                                           nbest_size)
    return Vocabulary(self.source_model_path, self.target_model_path, source, target,
                      self.pieces)


def pieces(tokenizer) -> tuple[str, ...]:
  """A tokenizer's pieces (a tf-text SentencePiece tokenizer or a PieceTableTokenizer), in id
  order."""
  ids = tf.range(tokenizer.vocab_size())
  return tuple(piece.decode("utf-8") for piece in tokenizer.id_to_string(ids).numpy())


def _load(model_path: str, pieces: tuple[str, ...], alpha: float = 0.0, nbest_size: int = -1):
  """load_tokenizer's tokenizer, or with `pieces` a PieceTableTokenizer of the model."""
  if not pieces:
    return load_tokenizer(model_path, alpha, nbest_size)
  return PieceTableTokenizer(load_tokenizer(model_path, alpha, nbest_size, tf.string),
                             list(pieces))


def vocabulary_paths(model_dir: str, shared: bool, src_lang: str, tgt_lang: str):
  """Where a model directory keeps its subword models: (source path, target path); an imported
  model's (a PIECE_TABLE_FILE beside them) whatever the languages."""
  if tf.io.gfile.exists(os.path.join(model_dir, PIECE_TABLE_FILE)):
    return os.path.join(model_dir, SOURCE_MODEL_FILE), os.path.join(model_dir, TARGET_MODEL_FILE)
  if shared:
    path = os.path.join(model_dir, "spm.joint.model")
    return path, path
  return (os.path.join(model_dir, f"spm.{src_lang}.model"),
          os.path.join(model_dir, f"spm.{tgt_lang}.model"))


def load_vocabulary(source_model_path: str, target_model_path: str) -> Vocabulary:
  """The Vocabulary of two subword model files (the same twice when joint), with the joint
  table of a PIECE_TABLE_FILE beside the source's (an imported model)."""
  table_path = os.path.join(os.path.dirname(source_model_path), PIECE_TABLE_FILE)
  pieces = ()
  if tf.io.gfile.exists(table_path):
    with tf.io.gfile.GFile(table_path) as f:
      pieces = tuple(json.load(f))
  source = _load(source_model_path, pieces)
  target = source if target_model_path == source_model_path else _load(target_model_path, pieces)
  return Vocabulary(source_model_path, target_model_path, source, target, pieces)


def _counted(sentences, progress: ProgressBar):
  """`sentences`, counted on `progress` (closed when SentencePiece has read them all: its
  training, which reports nothing, follows)."""
  count = 0
  for count, sentence in enumerate(sentences, start=1):
    if count % 10_000 == 0:
      progress.update(count)
    yield sentence
  progress.update(count)
  progress.close()


def ensure_vocabulary(model_dir: str, config, sentences) -> Vocabulary:
  """The task's subword model(s) in `model_dir`, trained on first use and reused after.

  Args:
    config: a DataConfig (vocab_size, spm_model_type, spm_byte_fallback, shared_vocab,
      languages; several target languages add their tokens, language_tags.tag, to the joint
      model).
    sentences: fn(side) -> iterator of training sentences, side being "both" (one joint model),
      "source" or "target".
  """
  c = config
  source_path, target_path = vocabulary_paths(model_dir, c.shared_vocab, c.src_lang, c.tgt_lang)
  sides = ([(source_path, "both")] if c.shared_vocab else
           [(source_path, "source"), (target_path, "target")])
  what = {"both": "one joint model of both sides", "source": "the source side",
          "target": "the target side"}
  for model_path, side in sides:
    if tf.io.gfile.exists(model_path):
      logging.info("reusing subword model %s", model_path)
      continue
    logging.info("training a %s SentencePiece model of %d pieces (%s%s)", c.spm_model_type,
                 c.vocab_size, what[side], ", byte fallback" if c.spm_byte_fallback else "")
    start = time.monotonic()
    progress = ProgressBar(None, unit="sentence", label="reading for SentencePiece",
                           delay_s=2.0)
    symbols = tuple(language_tags.tag(lang) for lang in c.tgt_langs) if len(
        c.tgt_langs) > 1 else ()
    train_sentencepiece(_counted(sentences(side), progress), model_path, c.vocab_size,
                        c.spm_model_type, c.spm_input_sentences, symbols, c.spm_byte_fallback)
    logging.info("subword model %s trained in %.0f s", model_path, time.monotonic() - start)
  return load_vocabulary(source_path, target_path)


def wait_for_vocabulary(model_dir: str, config, timeout_s: float = 3600.0,
                        poll_s: float = 2.0) -> None:
  """Waits until the chief worker has written the subword model(s) into `model_dir`, so that
  every worker of a multi-worker run uses the very same vocabulary.

  Raises:
    TimeoutError: they did not appear within `timeout_s`.
  """
  c = config
  paths = set(vocabulary_paths(model_dir, c.shared_vocab, c.src_lang, c.tgt_lang))
  deadline = time.monotonic() + timeout_s
  while not all(tf.io.gfile.exists(path) for path in paths):
    if time.monotonic() > deadline:
      raise TimeoutError(f"{model_dir}: the chief worker wrote no subword model in "
                         f"{timeout_s:.0f} s ({', '.join(sorted(paths))})")
    time.sleep(poll_s)
