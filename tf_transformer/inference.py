"""A model directory or a SavedModel as Python functions over lists of sentences:
`TranslationModel`, what `tf_transformer.load` returns and the CLIs use (the batching by length
is length_batching.py's)."""

import dataclasses
import json
import os
from typing import Callable

import numpy as np
import tensorflow as tf

from tf_transformer import model_dir as model_dir_lib
from tf_transformer.checkpoints import load_for_inference
from tf_transformer.config import DecodeConfig
from tf_transformer.length_batching import align_texts, count_words, score_texts, translate_texts
from tf_transformer.model_dir import ModelDirError
from tf_transformer.translator import Translator


@dataclasses.dataclass(frozen=True)
class InferenceFunctions:
  """What translation and scoring call, the same for a model directory and a SavedModel.

  Attributes:
    translate_nbest: fn(string [B]) -> {"outputs": string [B, n], "scores": float32 [B, n]}.
    translate_prefix: fn(string [B], prefix string [B]) -> as translate_nbest, each output
      starting with its prefix (`Translator.translate_prefix`).
    score: fn(source string [B], target string [B]) -> {"log_prob": float32 [B]}.
    align: fn(string [B]) -> the dict of `Translator.align`.
    count_tokens: fn(texts, side) -> list of int: the tokens of each text, `side` being
      "source" or "target" (for token-based batches).
  """
  translate_nbest: Callable
  translate_prefix: Callable
  score: Callable
  align: Callable
  count_tokens: Callable


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One entry of an n-best list: a translation and its score (the log-probability over the
  length penalty, as beam search ranks it)."""
  text: str
  score: float


class TranslationModel:
  """A trained model as Python functions over lists of sentences.

  One object over a model directory (at one checkpoint) and an exported SavedModel, returned by
  `load` (`tf_transformer.load`). Sentences go through in batches of similar length and come
  back in input order; blank ones come back as "". A SavedModel's search (beam size, alpha)
  was fixed at export; a model directory's may change from call to call (each setting is
  built once, at its first use).

  Attributes:
    path: the folder loaded.
    is_saved_model: whether it is a SavedModel.
    decode_config: the search when a call names none (a SavedModel's: its export's).
  """

  def __init__(self, path: str, is_saved_model: bool, decode_config, functions_for: Callable):
    """functions_for: fn(beam_size, alpha) -> InferenceFunctions of that search."""
    self.path = path
    self.is_saved_model = is_saved_model
    self.decode_config = decode_config
    self._functions_for = functions_for

  def functions(self, beam_size: int | None = None,
                alpha: float | None = None) -> InferenceFunctions:
    """The batch functions (tensors in and out) of a search (None: `decode_config`'s)."""
    beam_size = self.decode_config.beam_size if beam_size is None else beam_size
    alpha = self.decode_config.alpha if alpha is None else alpha
    fixed = (self.decode_config.beam_size, self.decode_config.alpha)
    if self.is_saved_model and (beam_size, alpha) != fixed:
      raise ModelDirError(f"{self.path}: beam_size={fixed[0]} and alpha={fixed[1]} are fixed "
                          "in this SavedModel at export; export again to change them")
    if beam_size < 1:
      raise ModelDirError(f"beam_size must be at least 1, got {beam_size}")
    return self._functions_for(beam_size, alpha)

  def count_tokens(self, texts: list[str], side: str = "source") -> list[int]:
    """The tokens + </s> of each text on `side` ("source" or "target"), as token batches count
    them: subword tokens (a model directory) or whitespace words (a SavedModel)."""
    return self.functions(None, None).count_tokens(list(texts), side)

  def translate(self, sources, *, beam_size: int | None = None, alpha: float | None = None,
                nbest: int = 1, target_prefix=None, batch_size: int | None = 64,
                batch_tokens: int | None = None, progress=None):
    """Translates `sources` (a list of str).

    Args:
      beam_size, alpha: the search (None: `decode_config`'s).
      nbest: 1 returns the best translation of each source; more returns that many
        `Hypothesis` (text, score) per source, best first (at most beam_size).
      target_prefix: optional list of str, one per source: each translation starts with it
        (its subword pieces are forced, the search continues after them); "" forces nothing.
      batch_size, batch_tokens: at most this many sentences, or tokens counting padding, a
        batch (see `length_batching.make_batches`).
      progress: optional progress bar, `.update(count done)`.

    Returns:
      nbest 1: list of str; else a list of lists of Hypothesis.
    """
    functions = self.functions(beam_size, alpha)
    beam = self.decode_config.beam_size if beam_size is None else beam_size
    if not 1 <= nbest <= beam:
      raise ModelDirError(f"nbest must be between 1 and the beam size ({beam}), got {nbest}")
    sources = list(sources)
    translate = functions.translate_nbest
    if target_prefix is not None:
      target_prefix = list(target_prefix)
      if len(target_prefix) != len(sources):
        raise ModelDirError(f"{len(sources)} sources but {len(target_prefix)} target prefixes: "
                            "give one prefix per source (\"\" for none)")
      translate = functions.translate_prefix
    outputs, scores = translate_texts(translate, sources, batch_size, progress, batch_tokens,
                                      functions.count_tokens, target_prefix)
    if nbest == 1:
      return [hypotheses[0] for hypotheses in outputs]
    return [[Hypothesis(text, score) for text, score in list(zip(texts, values))[:nbest]]
            for texts, values in zip(outputs, scores)]

  def score(self, sources, targets, *, alpha: float | None = None,
            batch_size: int | None = 64, batch_tokens: int | None = None,
            progress=None) -> list[float]:
    """The log-probability of each target given its source over the length penalty
    ((5 + length) / 6)^alpha, as beam search scores a hypothesis (alpha 0: the plain
    log-probability). Every pair is scored, blank ones too (a blank target is `</s>` alone).
    """
    sources, targets = list(sources), list(targets)
    if len(sources) != len(targets):
      raise ModelDirError(f"{len(sources)} sources but {len(targets)} targets: score takes "
                          "line-aligned pairs")
    functions = self.functions(None, alpha)
    return score_texts(functions.score, sources, targets, batch_size, progress, batch_tokens,
                       functions.count_tokens)

  def align(self, sources, *, beam_size: int | None = None, alpha: float | None = None,
            batch_size: int | None = 64, batch_tokens: int | None = None, progress=None):
    """The best translation of each source and its hard alignment (see `hard_alignment`).

    Returns:
      (list of str, list of lists of (source piece, target piece) 0-based index pairs).
    """
    functions = self.functions(beam_size, alpha)
    return align_texts(functions.align, list(sources), batch_size, progress, batch_tokens,
                       functions.count_tokens)


def load(path: str, *, checkpoint: str | None = None, src_lang: str | None = None,
         tgt_lang: str | None = None, **search) -> TranslationModel:
  """A trained model to translate and score with, from a model directory or a SavedModel.

      model = tf_transformer.load("models/multi30k_en_de")
      model.translate(["A dog runs on the beach."], beam_size=4)

  Args:
    path: a model directory (what train writes) or an exported SavedModel version folder
      (one holding saved_model.pb).
    checkpoint: a model directory's weights: final (default: the run's choice by dev), best,
      latest, average, ema or a checkpoint path (checkpoints.choose_checkpoint).
    src_lang, tgt_lang: the languages whose subword models a model directory with separate
      vocabularies reads (default: the ones it was trained with, from its data.json).
    search: config.DecodeConfig fields for a model directory (beam_size, alpha, max_length,
      extra_decode_length, decode_jit); a SavedModel's are fixed at export.

  Raises:
    ModelDirError: the folder, its vocabulary or its checkpoint is unusable, in one line.
  """
  if tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
    if checkpoint is not None or search:
      raise ModelDirError(f"{path}: a SavedModel holds its own weights and search (fixed at "
                          "export); give no checkpoint or search settings")
    return load_saved_model(path)
  model_dir_lib.check_exists(path)
  recorded = model_dir_lib.read_data(path)
  return load_model_dir(path, src_lang or recorded.get("src_lang", "en"),
                        tgt_lang or recorded.get("tgt_lang", "de"), DecodeConfig(**search),
                        checkpoint)


def load_model_dir(model_dir: str, src_lang: str, tgt_lang: str, decode_config,
                   checkpoint: str | None = None) -> TranslationModel:
  """The model of `model_dir` at `checkpoint` (None: final), searching with `decode_config`'s
  settings unless a call gives others; tokens are counted as its real subword tokens (truncated
  to max_length on the source side) + </s>."""
  model, vocabulary, _ = load_for_inference(model_dir, src_lang, tgt_lang, checkpoint or "final")
  translators = {}

  def functions_for(beam_size, alpha):
    if (beam_size, alpha) not in translators:
      settings = dataclasses.replace(decode_config, beam_size=beam_size, alpha=alpha,
                                     nbest=beam_size)
      translator = Translator(model, vocabulary, **dataclasses.asdict(settings))
      # closures keep the module alive: its tf.function methods hold it only weakly
      translators[beam_size, alpha] = InferenceFunctions(
          lambda texts: translator.translate_nbest(texts),
          lambda texts, prefixes: translator.translate_prefix(texts, prefixes),
          lambda source, target: translator.score(source, target),
          lambda texts: translator.align(texts),
          lambda texts, side: _count_subwords(translator, texts, side))
    return translators[beam_size, alpha]

  return TranslationModel(model_dir, False, decode_config, functions_for)


def load_saved_model(saved_model: str) -> TranslationModel:
  """An exported SavedModel version folder, with the search fixed in it at export; tokens are
  counted as words (`count_words`: the subword models are in-graph).

  An older export without a signature (`score`, `align`, `translate_prefix`) fails so only when
  that function is called."""
  if not tf.io.gfile.exists(os.path.join(saved_model, "saved_model.pb")):
    raise ModelDirError(f"{saved_model}: no saved_model.pb (give a version folder such as "
                        "exports/<name>/<version>)")
  try:
    loaded = tf.saved_model.load(saved_model)
    loaded.signatures["translate_nbest"]  # pylint: disable=pointless-statement
  except (OSError, ValueError, KeyError, tf.errors.OpError) as e:
    reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    raise ModelDirError(f"{saved_model}: cannot load this SavedModel ({reason})") from None

  def signature(name):
    """The signature `name`; the closure keeps `loaded`, whose variables it uses, alive."""
    if name not in loaded.signatures:
      raise ModelDirError(f"{saved_model}: no '{name}' signature (an older export; export the "
                          "model again)")
    return loaded.signatures[name]

  functions = InferenceFunctions(
      lambda texts: signature("translate_nbest")(inputs=texts),
      lambda texts, prefixes: signature("translate_prefix")(inputs=texts, prefix=prefixes),
      lambda source, target: signature("score")(source=source, target=target),
      lambda texts: signature("align")(inputs=texts), count_words)
  return TranslationModel(saved_model, True, _export_search(saved_model, loaded),
                          lambda beam_size, alpha: functions)


def _export_search(saved_model: str, loaded) -> DecodeConfig:
  """The search a SavedModel was exported with: assets.extra/decoding.json's, or (an export
  without it) the beam size its translate_nbest returns, with the default alpha."""
  path = os.path.join(saved_model, "assets.extra", "decoding.json")
  fields = {field.name for field in dataclasses.fields(DecodeConfig)}
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      recorded = json.load(f)
    return DecodeConfig(**{key: value for key, value in recorded.items() if key in fields})
  beam = loaded.signatures["translate_nbest"].structured_outputs["outputs"].shape[1]
  return DecodeConfig(beam_size=beam or DecodeConfig.beam_size)


def load_inference(saved_model: str | None, model_dir: str | None, src_lang: str,
                   tgt_lang: str, decode_config,
                   checkpoint: str | None = None) -> TranslationModel:
  """The CLIs' `--saved_model` or `--model_dir` (exactly one) as a TranslationModel; a model
  directory searches with `decode_config` (the flags) at `checkpoint` (None: final).

  Raises:
    ModelDirError: both or neither given, a checkpoint with a SavedModel, or an unusable folder.
  """
  if bool(saved_model) == bool(model_dir):
    raise ModelDirError("give exactly one of --saved_model and --model_dir")
  if saved_model and checkpoint is not None:
    raise ModelDirError("--checkpoint picks a checkpoint of --model_dir; a SavedModel holds its "
                        "own weights")
  if model_dir:
    return load_model_dir(model_dir, src_lang, tgt_lang, decode_config, checkpoint)
  return load_saved_model(saved_model)


def _count_subwords(translator: Translator, texts: list[str], side: str) -> list[int]:
  """The subword tokens + </s> of each text as `translator` reads it on `side`."""
  if not texts:
    return []
  tokenizer = translator.source_tokenizer if side == "source" else translator.target_tokenizer
  counts = tokenizer.tokenize(tf.constant(texts)).row_lengths().numpy()
  if side == "source":
    counts = np.minimum(counts, translator.max_length)
  return [int(count) + 1 for count in counts]
