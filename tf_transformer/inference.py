"""A model directory or a SavedModel as Python functions over lists of sentences:
`TranslationModel`, what `tf_transformer.load` returns and the CLIs use (the batching by length
is length_batching.py's)."""

import dataclasses
import json
import os
from typing import Callable

import numpy as np
import tensorflow as tf
from absl import logging

from data_pipeline import language_tags
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.checkpoints import load_ensemble_for_inference, load_for_inference
from tf_transformer.config import DecodeConfig, target_languages
from tf_transformer.length_batching import align_texts, count_words, score_texts, translate_texts
from tf_transformer.decoding.lexical_constraints import ConstraintError
from tf_transformer.model_dir import ModelDirError
from tf_transformer.translator import Translator


@dataclasses.dataclass(frozen=True)
class InferenceFunctions:
  """What translation and scoring call, the same for a model directory and a SavedModel.

  Attributes:
    translate_nbest: fn(string [B]) -> {"outputs": string [B, n], "scores": float32 [B, n]}.
    translate_prefix: fn(string [B], prefix string [B]) -> as translate_nbest, each output
      starting with its prefix (`Translator.translate_prefix`).
    translate_constrained: fn(string [B], constraints string [B]) -> as translate_nbest, each
      output containing its phrases (`Translator.translate_constrained`).
    translate_constrained_prefix: fn(string [B], constraints string [B], prefix string [B]) ->
      as translate_nbest.
    sample: fn(string [B], seed int64 [B]) -> {"outputs": string [B], "scores": float32 [B]}
      (`Translator.sample`).
    sample_prefix: fn(string [B], prefix string [B], seed int64 [B]) -> as sample.
    score: fn(source string [B], target string [B]) -> {"log_prob": float32 [B]}.
    align: fn(string [B]) -> the dict of `Translator.align`.
    count_tokens: fn(texts, side) -> list of int: the tokens of each text, `side` being
      "source" or "target" (for token-based batches).
  """
  translate_nbest: Callable
  translate_prefix: Callable
  translate_constrained: Callable
  translate_constrained_prefix: Callable
  sample: Callable
  sample_prefix: Callable
  score: Callable
  align: Callable
  count_tokens: Callable


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One entry of an n-best list: a translation and its score (the log-probability over the
  length penalty, as beam search ranks it)."""
  text: str
  score: float


# What a call may change in a SavedModel's search: the rest is compiled into it at export.
_CHANGEABLE_IN_A_SAVED_MODEL = ("strategy", "nbest", "seed")


def sample_seed(seed: int, sentence: int, draw: int) -> int:
  """The int64 seed of the `draw`-th sample (from 0) of sentence number `sentence` under the
  run's `seed`: a sentence's first sample is the same whatever the number of samples."""
  return ((seed + draw * 0x9E3779B1) % 2**31) * 2**32 + sentence % 2**32


class TranslationModel:
  """A trained model as Python functions over lists of sentences.

  One object over a model directory (at one checkpoint) and an exported SavedModel, returned by
  `load` (`tf_transformer.load`). Sentences go through in batches of similar length and come
  back in input order; blank ones come back as "". A call may change the search
  (config.DecodeConfig fields as keyword arguments): a model directory's builds each new
  search once, at its first use; a SavedModel's is fixed at export but for its strategy
  ("beam" or "sample"), nbest and seed.

  A multilingual model (trained with several target languages) translates into the one a call
  names (`target_language`), or else into `target_language`: the calls put its token
  (language_tags.py) before each source, as training did, for a SavedModel too.

  Attributes:
    path: the folder loaded.
    is_saved_model: whether it is a SavedModel.
    decode_config: the search when a call changes none (a SavedModel's: its export's).
    languages: the target languages the model was trained on.
    target_language: a multilingual model's language when a call names none, or None.
  """

  def __init__(self, path: str, is_saved_model: bool, decode_config, functions_for: Callable,
               languages: tuple[str, ...] = ("de",), target_language: str | None = None):
    """functions_for: fn(config.DecodeConfig) -> InferenceFunctions of that search."""
    self.path = path
    self.is_saved_model = is_saved_model
    self.decode_config = decode_config
    self._functions_for = functions_for
    self.languages = tuple(languages)
    self.target_language = target_language

  def _tagged(self, sources: list[str], target_language: str | None) -> list[str]:
    """`sources` as the model reads them: a multilingual model's with the token of
    `target_language` (None: the model's `target_language`) before each one.

    Raises:
      LanguageError: a language the model was not trained on, or none for a multilingual one.
    """
    lang = language_tags.choose(target_language or self.target_language, self.languages,
                                self.path)
    return language_tags.tagged(sources, lang) if lang else sources

  def search_config(self, **search) -> DecodeConfig:
    """`decode_config` with the fields of `search` that are not None replaced.

    Raises:
      ModelDirError: an unknown field, or a SavedModel's field fixed at export changed.
      ConfigError: a value outside its domain (config.DecodeConfig).
    """
    changes = {name: value for name, value in search.items() if value is not None}
    fields = {field.name for field in dataclasses.fields(DecodeConfig)}
    unknown = sorted(set(changes) - fields)
    if unknown:
      raise ModelDirError(f"unknown search setting {unknown[0]!r}; the settings are "
                          + ", ".join(sorted(fields)))
    fixed = sorted(name for name, value in changes.items()
                   if name not in _CHANGEABLE_IN_A_SAVED_MODEL
                   and value != getattr(self.decode_config, name))
    if self.is_saved_model and fixed:
      exported = " and ".join(f"{name}={getattr(self.decode_config, name)}" for name in fixed)
      raise ModelDirError(f"{self.path}: {exported} {'is' if len(fixed) == 1 else 'are'} "
                          "fixed in this SavedModel at export; export again to change "
                          f"{'it' if len(fixed) == 1 else 'them'}")
    return dataclasses.replace(self.decode_config, **changes)

  def functions(self, config: DecodeConfig | None = None) -> InferenceFunctions:
    """The batch functions (tensors in and out) of a search (None: `decode_config`)."""
    return self._functions_for(config or self.decode_config)

  def count_tokens(self, texts: list[str], side: str = "source") -> list[int]:
    """The tokens + </s> of each text on `side` ("source" or "target"), as token batches count
    them: subword tokens (a model directory) or whitespace words (a SavedModel)."""
    return self.functions().count_tokens(list(texts), side)

  def translate(self, sources, *, nbest: int = 1, target_prefix=None, constraints=None,
                batch_size: int | None = 64, batch_tokens: int | None = None, progress=None,
                first_index: int = 0, target_language: str | None = None, **search):
    """Translates `sources` (a list of str).

    Args:
      nbest: 1 returns one translation of each source; more returns that many `Hypothesis`
        (text, score) per source: the best first (at most beam_size) of a beam search, or
        that many independent samples, in the order drawn.
      target_prefix: optional list of str, one per source: each translation starts with it
        (its subword pieces are forced, the search continues after them); "" forces nothing.
      constraints: optional list, one per source, of lists of target phrases (str): every
        translation of the source contains each phrase, in any order, as whole words, and
        none of the phrases written with a leading "!" (beam search only; `[]` for none).
      batch_size, batch_tokens: at most this many sentences, or tokens counting padding, a
        batch (see `length_batching.make_batches`).
      progress: optional progress bar, `.update(count done)`.
      first_index: the number of the first source (a sample's seed is the run's seed and its
        sentence's number, so a source gets the same samples in any batch or call).
      target_language: a multilingual model's output language (see the class).
      search: config.DecodeConfig fields changed for this call (strategy, beam_size, alpha,
        sampling_topk, sampling_topp, sampling_temperature, seed, ...).

    Returns:
      nbest 1: list of str; else a list of lists of Hypothesis.

    Raises:
      ConstraintError: a source's constraints cannot be met (an empty phrase, more pieces than
        max_constraint_tokens, more than fit the output's length limit), numbered from
        first_index.
    """
    config = self.search_config(nbest=nbest, **search)
    functions = self.functions(config)
    sources = self._tagged(list(sources), target_language)
    prefixes = None
    if target_prefix is not None:
      prefixes = list(target_prefix)
      if len(prefixes) != len(sources):
        raise ModelDirError(f"{len(sources)} sources but {len(prefixes)} target prefixes: "
                            "give one prefix per source (\"\" for none)")
    if constraints is not None:
      if config.strategy == "sample":
        raise ModelDirError("constraints need a beam search, not --strategy=sample")
      constraints = _constraint_lines(constraints, len(sources), first_index)
    if config.strategy == "sample":
      return self._sample(functions, config, sources, prefixes, first_index,
                          batch_size=batch_size, batch_tokens=batch_tokens, progress=progress)
    if constraints is not None:
      translate = (functions.translate_constrained if prefixes is None
                   else functions.translate_constrained_prefix)
    else:
      translate = functions.translate_nbest if prefixes is None else functions.translate_prefix
    try:
      outputs, scores = translate_texts(translate, sources, batch_size, progress, batch_tokens,
                                        functions.count_tokens, prefixes,
                                        constraints=constraints)
    except ConstraintError as e:
      raise ConstraintError(first_index + e.sentence, e.problem) from None
    return _hypotheses(outputs, scores, nbest)

  @staticmethod
  def _sample(functions, config, sources, prefixes, first_index, **batching):
    """`translate` by random sampling: config.nbest draws of each source, each its own row."""
    draws = config.nbest
    rows = [source for source in sources for _ in range(draws)]
    seeds = [sample_seed(config.seed, first_index + sentence, draw)
             for sentence in range(len(sources)) for draw in range(draws)]
    if prefixes is not None:
      prefixes = [prefix for prefix in prefixes for _ in range(draws)]
    sample = functions.sample if prefixes is None else functions.sample_prefix
    progress = batching.pop("progress")
    outputs, scores = translate_texts(
        lambda *inputs: {name: value[:, tf.newaxis] for name, value in sample(*inputs).items()},
        rows, batching["batch_size"], None if progress is None else _Scaled(progress, draws),
        batching["batch_tokens"], functions.count_tokens, prefixes, seeds)
    outputs = [[row[0] for row in outputs[i:i + draws]] for i in range(0, len(rows), draws)]
    scores = [[row[0] for row in scores[i:i + draws]] for i in range(0, len(rows), draws)]
    return _hypotheses(outputs, scores, draws)

  def score(self, sources, targets, *, alpha: float | None = None,
            batch_size: int | None = 64, batch_tokens: int | None = None,
            progress=None, target_language: str | None = None) -> list[float]:
    """The log-probability of each target given its source over the length penalty
    ((5 + length) / 6)^alpha, as beam search scores a hypothesis (alpha 0: the plain
    log-probability). Every pair is scored, blank ones too (a blank target is `</s>` alone).
    A multilingual model's targets are in `target_language` (see the class).
    """
    sources, targets = self._tagged(list(sources), target_language), list(targets)
    if len(sources) != len(targets):
      raise ModelDirError(f"{len(sources)} sources but {len(targets)} targets: score takes "
                          "line-aligned pairs")
    functions = self.functions(self.search_config(alpha=alpha))
    return score_texts(functions.score, sources, targets, batch_size, progress, batch_tokens,
                       functions.count_tokens)

  def align(self, sources, *, batch_size: int | None = 64, batch_tokens: int | None = None,
            progress=None, target_language: str | None = None, **search):
    """The best translation of each source (beam search) and its hard alignment (see
    `hard_alignment`); `search` and `target_language` as in `translate`.

    Returns:
      (list of str, list of lists of (source piece, target piece) 0-based index pairs).
    """
    functions = self.functions(self.search_config(**search))
    sources = list(sources)
    tagged = self._tagged(sources, target_language)
    texts, alignments = align_texts(functions.align, tagged, batch_size, progress,
                                    batch_tokens, functions.count_tokens)
    if tagged is not sources:  # the source pieces of the text, not of the token before it
      shift = language_tags.TAG_PIECES
      alignments = [[(source - shift, target) for source, target in pairs if source >= shift]
                    for pairs in alignments]
    return texts, alignments


class _Scaled:
  """A progress bar over sentences, updated with counts of rows (`draws` rows a sentence)."""

  def __init__(self, progress, draws: int):
    self._progress, self._draws = progress, draws

  def update(self, rows_done: int):
    self._progress.update(rows_done // self._draws)


def _constraint_lines(constraints, count: int, first_index: int) -> list[str]:
  """Each source's list of phrases as one tab-separated line (Translator.translate_constrained).

  Raises:
    ModelDirError: not one list per source.
    ConstraintError: a blank phrase, or one holding a tab or a line break.
  """
  constraints = list(constraints)
  if len(constraints) != count:
    raise ModelDirError(f"{count} sources but {len(constraints)} lists of constraints: give "
                        "one list of phrases per source ([] for none)")
  lines = []
  for index, phrases in enumerate(constraints):
    if isinstance(phrases, str):
      raise ModelDirError(f"the constraints of sentence {first_index + index + 1} are a str: "
                          "give a list of phrases")
    for phrase in phrases:
      if not phrase.strip("! \t") or any(c in phrase for c in "\t\r\n"):
        raise ConstraintError(first_index + index,
                              f"{phrase!r} is not a phrase (empty, or with a tab or line break)")
    lines.append("\t".join(phrases))
  return lines


def _hypotheses(outputs, scores, nbest: int):
  """Lists of outputs and of scores per source -> nbest 1: the first output of each; else
  lists of the first nbest Hypothesis."""
  if nbest == 1:
    return [texts[0] for texts in outputs]
  return [[Hypothesis(text, score) for text, score in list(zip(texts, values))[:nbest]]
          for texts, values in zip(outputs, scores)]


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
      (one holding saved_model.pb), or a list of model directories: an ensemble (decoding/ensemble.py),
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
                            "(export one with export_saved_model --ensemble)")
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
      # closures keep the module alive: its tf.function methods hold it only weakly
      translators[key] = InferenceFunctions(
          lambda texts: translator.translate_nbest(texts),
          lambda texts, prefixes: translator.translate_prefix(texts, prefixes),
          lambda texts, constraints: translator.translate_constrained(texts, constraints),
          lambda texts, constraints, prefixes: translator.translate_constrained_prefix(
              texts, constraints, prefixes),
          lambda texts, seeds: translator.sample(texts, seeds),
          lambda texts, prefixes, seeds: translator.sample_prefix(texts, prefixes, seeds),
          lambda source, target: translator.score(source, target),
          lambda texts: translator.align(texts),
          lambda texts, side: _count_subwords(translator, texts, side))
    return translators[key]

  return TranslationModel(model_dir, False, decode_config, functions_for, languages,
                          _chosen_language(languages, tgt_lang, model_dir))


def _chosen_language(languages: tuple[str, ...], tgt_lang: str | None, path: str) -> str | None:
  """A multilingual model's language when a call names none: `tgt_lang` (--tgt_lang) when it
  names one language, checked; else None (a call must name one)."""
  if len(languages) == 1 or not tgt_lang or len(target_languages(tgt_lang)) > 1:
    return None
  return language_tags.choose(tgt_lang, languages, path)


def load_saved_model(saved_model: str, tgt_lang: str | None = None) -> TranslationModel:
  """An exported SavedModel version folder, with the search fixed in it at export; tokens are
  counted as words (`count_words`: the subword models are in-graph). A multilingual model's
  default language is `tgt_lang` (see `_chosen_language`).

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
      lambda texts, constraints: signature("translate_constrained")(inputs=texts,
                                                                    constraints=constraints),
      lambda texts, constraints, prefixes: signature("translate_constrained_prefix")(
          inputs=texts, constraints=constraints, prefix=prefixes),
      lambda texts, seeds: signature("sample")(inputs=texts, seed=seeds),
      lambda texts, prefixes, seeds: signature("sample_prefix")(inputs=texts, prefix=prefixes,
                                                                seed=seeds),
      lambda source, target: signature("score")(source=source, target=target),
      lambda texts: signature("align")(inputs=texts), count_words)
  recorded = _export_settings(saved_model)
  if recorded.get("batching"):
    replay_warmup_requests(saved_model, loaded)
  languages = target_languages(recorded.get("tgt_lang") or tgt_lang or "de")
  return TranslationModel(saved_model, True, _export_search(recorded, loaded),
                          lambda config: functions, languages,
                          _chosen_language(languages, tgt_lang, saved_model))


def _export_settings(saved_model: str) -> dict:
  """assets.extra/decoding.json of a SavedModel: the settings fixed at export ({} if absent)."""
  path = os.path.join(saved_model, "assets.extra", "decoding.json")
  if not tf.io.gfile.exists(path):
    return {}
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def replay_warmup_requests(saved_model: str, loaded) -> int:
  """Runs a SavedModel's TF Serving warm-up requests (assets.extra/tf_serving_warmup_requests)
  as TF Serving does at load: an export with in-graph batching runs its merged searches at each
  allowed batch size, and each is compiled here, before the caller's first request.

  Returns:
    The number of requests run.

  Raises:
    ModelDirError: the XLA programs would exhaust the system's memory mappings (see
      `_memory_mapping_problem`), before they do: past the limit, XLA's compiler fails and the
      process dies with a segmentation fault.
  """
  from tensorflow_serving.apis import prediction_log_pb2

  path = os.path.join(saved_model, "assets.extra", "tf_serving_warmup_requests")
  requests = [prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
              for record in tf.data.TFRecordDataset(path)]
  rows = [_request_rows(request) for request in requests]
  names = [request.model_spec.signature_name for request in requests]
  # by batch size (stable): each larger size compiles about the programs of the smallest, so
  # the growth of the smallest's requests to the signatures that recur at the larger sizes
  # estimates the rest (the others' one request each mostly runs programs already compiled,
  # and counting them would underestimate; and searches share programs, so the first
  # requests alone would not be a fair sample either)
  order = sorted(range(len(requests)), key=rows.__getitem__)
  smallest = min(rows, default=0)
  recurring = {name for name, size in zip(names, rows) if size > smallest}
  limit, growths, sample = memory_mapping_limit(), [], []
  for index, i in enumerate(order):
    before = memory_mappings() if limit else 0
    per_request = sum(sample) / len(sample) if sample and rows[i] > smallest else None
    if per_request is not None and rows[order[index - 1]] == smallest:
      logging.info("%s: the warm-up requests of %d row(s) added %s memory mappings; the %d "
                   "larger ones are expected to add about %s (vm.max_map_count=%s leaves %s)",
                   saved_model, smallest, f"{sum(growths):,}", len(requests) - index,
                   f"{round(per_request * (len(requests) - index)):,}", f"{limit:,}",
                   f"{limit - before:,}")
    problem = _memory_mapping_problem(before, limit, growths, len(requests) - index,
                                      per_request)
    if problem:
      raise ModelDirError(f"{saved_model}: its {len(requests)} warm-up requests compile XLA "
                          f"programs that {problem}: raise it (sysctl -w "
                          "vm.max_map_count=1048576), or export with a smaller "
                          "--batching_max_size or with --nodecode_jit")
    loaded.signatures[names[i]](**{
        name: tf.constant(tf.make_ndarray(proto)) for name, proto in requests[i].inputs.items()})
    if limit:
      growths.append(memory_mappings() - before)
      if rows[i] == smallest and names[i] in recurring:
        sample.append(growths[-1])
  return len(requests)


def _request_rows(request) -> int:
  """The rows of a PredictRequest: its first input's first dimension."""
  shape = next(iter(request.inputs.values())).tensor_shape.dim
  return shape[0].size if shape else 1


def memory_mapping_limit() -> int | None:
  """The most memory mappings a process may hold (Linux's vm.max_map_count), or None where
  the system does not say."""
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read())
  except (OSError, ValueError):
    return None


def memory_mappings() -> int:
  """The memory mappings this process holds (0 where the system does not say)."""
  try:
    with open("/proc/self/maps") as f:
      return sum(1 for _ in f)
  except OSError:
    return 0


def _memory_mapping_problem(mappings: int, limit: int | None, growths: list[int],
                            remaining: int, per_request: float | None = None) -> str | None:
  """Why the next `remaining` warm-up requests would exceed `limit` memory mappings, or None.

  XLA's CPU compiler maps three memory regions (code, constants, data) for each kernel of a
  program and keeps them: about 520 a program for a search at base dims (6 layers), so that
  an export of base dims with --batching (61 warm-up requests, most of them compiling a
  program) needs about half of Linux's default vm.max_map_count of 65,530 (docs/serving.md).
  Given `per_request`, the rest are refused once they need a quarter more than the room left;
  and any request is refused whose room is less than twice the largest growth seen.

  Args:
    mappings: the mappings held now; limit: memory_mapping_limit() (None: no check).
    growths: the mappings each request so far added (compiled programs add, cached ones not).
    remaining: the requests still to run, the next one included.
    per_request: the mappings each remaining request is expected to add, or None (not known
      yet: before the requests of a whole batch size have run).
  """
  if not limit:
    return None
  room = limit - mappings
  if not growths:
    return None if room > _FIRST_PROGRAM_MAPPINGS else (
        f"need more memory mappings than the {max(room, 0):,} that vm.max_map_count="
        f"{limit:,} leaves")
  needed = max(round(per_request * remaining) if per_request is not None else 0,
               2 * max(growths))
  if needed > 1.25 * room or room < 2 * max(growths):
    return (f"need about {needed:,} more memory mappings, and vm.max_map_count={limit:,} "
            f"leaves {max(room, 0):,}")
  return None


# Room demanded before the first request, when no growth is known yet: a base-size program's.
_FIRST_PROGRAM_MAPPINGS = 1000


def _export_search(recorded: dict, loaded) -> DecodeConfig:
  """The search a SavedModel was exported with: its settings' (`_export_settings`), or (an
  export without them) the beam size its translate_nbest returns, with the default alpha."""
  fields = {field.name for field in dataclasses.fields(DecodeConfig)}
  if recorded:
    if "max_length" in recorded:  # its name in exports before the sampling signatures
      recorded.setdefault("max_source_length", recorded["max_length"])
    return DecodeConfig(**{key: value for key, value in recorded.items() if key in fields})
  beam = loaded.signatures["translate_nbest"].structured_outputs["outputs"].shape[1]
  return DecodeConfig(beam_size=beam or DecodeConfig.beam_size)


def load_inference(saved_model: str | None, model_dir: str | None, src_lang: str,
                   tgt_lang: str, decode_config, checkpoint: str | None = None,
                   ensemble=(), weights=()) -> TranslationModel:
  """The CLIs' `--saved_model`, `--model_dir` or `--ensemble` (the model directories of an
  ensemble, with `weights`: --ensemble_weights) as a TranslationModel; model directories search
  with `decode_config` (the flags) at `checkpoint` (None: final). --ensemble takes the place
  of --model_dir (which a flagfile shared with training sets).

  Raises:
    ModelDirError: none or two of them given, a checkpoint with a SavedModel, or an unusable
      folder.
  """
  if ensemble:
    if saved_model:
      raise ModelDirError("give --ensemble (model directories) or --saved_model, not both")
    return load_model_dir(list(ensemble), src_lang, tgt_lang, decode_config, checkpoint,
                          weights)
  if weights:
    raise ModelDirError("--ensemble_weights weigh the members of --ensemble")
  if bool(saved_model) == bool(model_dir):
    raise ModelDirError("give exactly one of --saved_model and --model_dir")
  if saved_model and checkpoint is not None:
    raise ModelDirError("--checkpoint picks a checkpoint of --model_dir; a SavedModel holds its "
                        "own weights")
  if model_dir:
    return load_model_dir(model_dir, src_lang, tgt_lang, decode_config, checkpoint)
  return load_saved_model(saved_model, tgt_lang)


def _count_subwords(translator: Translator, texts: list[str], side: str) -> list[int]:
  """The subword tokens + </s> of each text as `translator` reads it on `side`."""
  if not texts:
    return []
  tokenizer = translator.source_tokenizer if side == "source" else translator.target_tokenizer
  counts = tokenizer.tokenize(tf.constant(texts)).row_lengths().numpy()
  if side == "source":
    counts = np.minimum(counts, translator.max_source_length)
  return [int(count) + 1 for count in counts]
