"""Loading a trained model for translation: `load` (`tf_transformer.load`), a model directory
(at a checkpoint, or several as an ensemble) or an exported SavedModel as one
inference.TranslationModel."""

import dataclasses
import functools
import os

import numpy as np
import tensorflow as tf

from data_pipeline import language_tags
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.checkpoints import load_ensemble_for_inference, load_for_inference
from tf_transformer.config import DecodeConfig, target_languages
from tf_transformer.inference import InferenceFunctions, TranslationModel
from tf_transformer.length_batching import count_words
from tf_transformer.model_dir import ModelDirError
from tf_transformer.serving import export_format, signatures, warmup
from tf_transformer.serving.translator import Translator


def load(path, *, checkpoint: str | None = None, src_lang: str | None = None,
         tgt_lang: str | None = None, weights=(), **search) -> TranslationModel:
  """A trained model to translate and score with, from a model directory or a SavedModel.

      model = tf_transformer.load("models/multi30k_en_de")
      model.translate(["A dog runs on the beach."], beam_size=4)
      ensemble = tf_transformer.load(["models/run1", "models/run2"])
      multilingual = tf_transformer.load("models/multi30k_en_multi")
      multilingual.translate(["A dog runs on the beach."], target_language="fr")

  Args:
    path: a model directory (what train writes), an exported SavedModel version folder
      (one holding saved_model.pb), or a list of model directories: an ensemble
      (decoding/ensemble.py),
      their log-probabilities averaged with `weights` (one each; default: equal) at each step
      of one search.
    checkpoint: a model directory's weights: final (default: the run's choice by dev), best,
      latest, average, ema or a checkpoint path (checkpoints.choose_checkpoint).
    src_lang, tgt_lang: the languages whose subword models a model directory with separate
      vocabularies reads (default: the ones it was trained with, from its data.json); a
      multilingual model's tgt_lang: its output language when a call names none.
    search: config.DecodeConfig fields for a model directory (strategy, beam_size, alpha,
      sampling settings, max_source_length, extra_decode_length, decode_jit); a SavedModel's
      are fixed at export.

  Raises:
    ModelDirError: the folder, its vocabulary or its checkpoint is unusable, in one line.
  """
  paths = [path] if isinstance(path, str) else list(path)
  if len(paths) > 1 or weights:
    for folder in paths:
      if tf.io.gfile.exists(os.path.join(folder, "saved_model.pb")):
        raise ModelDirError(f"{folder}: a SavedModel; an ensemble is of model directories "
                            "(export one with export.saved_model.export of several directories)")
  path = paths[0]
  if tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
    if checkpoint is not None or search:
      raise ModelDirError(f"{path}: a SavedModel holds its own weights and search (fixed at "
                          "export); give no checkpoint or search settings")
    return load_saved_model(path, tgt_lang)
  model_dir_lib.check_exists(path)
  recorded = model_dir_lib.read_data(path)
  return load_model_dir(paths if len(paths) > 1 else path,
                        src_lang or recorded.get("src_lang", "en"),
                        tgt_lang or recorded.get("tgt_lang", "de"), DecodeConfig(**search),
                        checkpoint, weights)


def load_model_dir(model_dir, src_lang: str, tgt_lang: str, decode_config,
                   checkpoint: str | None = None, weights=()) -> TranslationModel:
  """The model of `model_dir` at `checkpoint` (None: final), searching with `decode_config`'s
  settings unless a call gives others; tokens are counted as its real subword tokens (truncated
  to max_source_length on the source side) + </s>. A list of directories: their ensemble,
  with `weights` (see checkpoints.load_ensemble_for_inference)."""
  if isinstance(model_dir, str):
    model, vocabulary, _ = load_for_inference(model_dir, src_lang, tgt_lang,
                                              checkpoint or "final")
  else:
    model, vocabulary, _ = load_ensemble_for_inference(model_dir, src_lang, tgt_lang,
                                                       checkpoint or "final", weights)
    model_dir = ",".join(model_dir)
  languages = target_languages(model_dir_lib.read_data(model_dir.split(",")[0]).get(
      "tgt_lang", tgt_lang))
  translators = {}

  def functions_for(config):
    key = config.search_key  # one Translator per compiled search
    if key not in translators:
      translator = Translator(model, vocabulary, dataclasses.replace(key, nbest=key.beam_size))
      # the module's tf.functions, bound to it: they keep it alive
      translators[key] = InferenceFunctions.of(
          lambda name: getattr(translator, signatures.BY_NAME[name].method),
          functools.partial(_count_subwords, translator))
    return translators[key]

  return TranslationModel(model_dir, False, decode_config, functions_for, languages,
                          _chosen_language(languages, tgt_lang, model_dir))


def _chosen_language(languages: tuple[str, ...], tgt_lang: str | None, path: str) -> str | None:
  """A multilingual model's language when a call names none: `tgt_lang` when it
  names one language, checked; else None (a call must name one)."""
  if len(languages) == 1 or not tgt_lang or len(target_languages(tgt_lang)) > 1:
    return None
  return language_tags.choose(tgt_lang, languages, path)


def load_saved_model(saved_model: str, tgt_lang: str | None = None) -> TranslationModel:
  """An exported SavedModel version folder, with the search fixed in it at export; tokens are
  counted as words (`count_words`: the subword models are in-graph). A multilingual model's
  default language is `tgt_lang` (see `_chosen_language`).

  An export without a signature (an older one, or one of some signatures only) fails so only
  when a function that needs it is called."""
  if not tf.io.gfile.exists(os.path.join(saved_model, "saved_model.pb")):
    raise ModelDirError(f"{saved_model}: no saved_model.pb (give a version folder such as "
                        "exports/<name>/<version>)")
  try:
    loaded = tf.saved_model.load(saved_model)
    if not set(loaded.signatures) & set(signatures.NAMES):
      raise KeyError(f"none of the signatures {', '.join(signatures.NAMES)}")
  except (OSError, ValueError, KeyError, tf.errors.OpError) as e:
    reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    raise ModelDirError(f"{saved_model}: cannot load this SavedModel ({reason})") from None

  recorded = export_format.read_settings(saved_model)

  def signature(name):
    """The signature `name`; the closure keeps `loaded`, whose variables it uses, alive."""
    if name not in loaded.signatures:
      if recorded.get("signatures"):
        raise ModelDirError(f"{saved_model}: exported with the signatures "
                            f"{', '.join(recorded['signatures'])} only, not '{name}' (export "
                            "the model again with it)")
      raise ModelDirError(f"{saved_model}: no '{name}' signature (an older export; export the "
                          "model again)")
    return loaded.signatures[name]

  functions = InferenceFunctions.of(
      lambda name: lambda *args: signatures.call(signature(name), name, *args), count_words)
  if recorded.get("batching"):
    warmup.replay_warmup_requests(saved_model, loaded)
  languages = target_languages(recorded.get("tgt_lang") or tgt_lang or "de")
  return TranslationModel(saved_model, True, export_format.export_search(recorded, loaded),
                          lambda config: functions, languages,
                          _chosen_language(languages, tgt_lang, saved_model))


def _count_subwords(translator: Translator, texts: list[str], side: str) -> list[int]:
  """The subword tokens + </s> of each text as `translator` reads it on `side`."""
  if not texts:
    return []
  tokenizer = translator.source_tokenizer if side == "source" else translator.target_tokenizer
  counts = tokenizer.tokenize(tf.constant(texts)).row_lengths().numpy()
  if side == "source":
    counts = np.minimum(counts, translator.max_source_length)
  return [int(count) + 1 for count in counts]
