"""A model directory or a SavedModel as Python functions over lists of sentences:
`TranslationModel`, what `tf_transformer.load` returns (loading.py) and the tools use (the
batching by length is length_batching.py's)."""

import dataclasses
import warnings
from typing import Callable

import tensorflow as tf

from data_pipeline import language_tags
from tf_transformer.config import DecodeConfig
from tf_transformer.decoding import strategies
from tf_transformer.decoding.lexical_constraints import ConstraintError
from tf_transformer.length_batching import align_texts, score_texts, translate_texts
from tf_transformer.model_dir import ModelDirError


@dataclasses.dataclass(frozen=True)
class InferenceFunctions:
  """What translation and scoring call, the same for a model directory and a SavedModel: a
  function for each signature but serving_default, taking its inputs positionally in the
  contract's order (serving/signatures.py), and count_tokens.

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

  @classmethod
  def of(cls, signature_function: Callable, count_tokens: Callable) -> "InferenceFunctions":
    """The functions signature_function(name) gives for each signature, with count_tokens."""
    return cls(count_tokens=count_tokens, **{
        field.name: signature_function(field.name) for field in dataclasses.fields(cls)
        if field.name != "count_tokens"})


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One entry of an n-best list: a translation and its score (the log-probability over the
  length penalty, as beam search ranks it)."""
  text: str
  score: float


class InputCutWarning(UserWarning):
  """Sentences of a call with a text (source, target prefix, or target to score) longer than
  max_source_length subword pieces: each was read up to there, and its answer is that of those
  first pieces (a translation of the start of the source, a score of the start of the target).

  Attributes:
    sentences: their indices, numbered from the call's first_index (0-based).
    max_source_length: the bound.
  """

  def __init__(self, sentences: list[int], max_source_length: int):
    self.sentences, self.max_source_length = list(sentences), max_source_length
    super().__init__(f"{self.numbers('sentence')} cut at max_source_length="
                     f"{max_source_length} subword pieces: the answer is that of the first "
                     "pieces")

  def numbers(self, unit: str) -> str:
    """"sentence 3 was", "sentences 3, 17 were" or "sentences 1, 2, ..., 10 and 5 more were"
    (`unit` "sentence"): the first ten sentences, numbered from 1."""
    shown = ", ".join(str(i + 1) for i in self.sentences[:10])
    more = f" and {len(self.sentences) - 10} more" if len(self.sentences) > 10 else ""
    if len(self.sentences) == 1:
      return f"{unit} {shown} was"
    return f"{unit}s {shown}{more} were"


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

  A text longer than the model's max_source_length subword pieces (a source, a target prefix,
  a target to score) is read up to there, and the call warns with an InputCutWarning naming
  its sentences (`warnings.simplefilter("error", InputCutWarning)` makes it an error).

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

  @staticmethod
  def _warn_cut(config: DecodeConfig, first_index: int = 0, per_sentence: int = 1):
    """on_cut for length_batching: an InputCutWarning of the sentences of the rows cut
    (`per_sentence` rows each) at the call's config.max_source_length, numbered from
    `first_index`."""
    def warn(rows):
      sentences = sorted({first_index + row // per_sentence for row in rows})
      warnings.warn(InputCutWarning(sentences, config.max_source_length), stacklevel=4)
    return warn

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
      strategies.check_constraints_allowed(config)
      constraints = _constraint_lines(constraints, len(sources), first_index)
    if config.strategy == "sample":
      return self._sample(functions, config, sources, prefixes,
                          self._warn_cut(config, first_index, config.nbest),
                          batch_size=batch_size,
                          batch_tokens=batch_tokens, progress=progress, first_index=first_index)
    if constraints is not None:
      translate = (functions.translate_constrained if prefixes is None
                   else functions.translate_constrained_prefix)
    else:
      translate = functions.translate_nbest if prefixes is None else functions.translate_prefix
    try:
      outputs, scores = translate_texts(translate, sources, batch_size, progress, batch_tokens,
                                        functions.count_tokens, prefixes,
                                        constraints=constraints,
                                        on_cut=self._warn_cut(config, first_index))
    except ConstraintError as e:
      raise ConstraintError(first_index + e.sentence, e.problem) from None
    return _hypotheses(outputs, scores, nbest)

  @staticmethod
  def _sample(functions, config, sources, prefixes, on_cut, first_index, **batching):
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
        batching["batch_tokens"], functions.count_tokens, prefixes, seeds, on_cut=on_cut)
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
    config = self.search_config(alpha=alpha)
    functions = self.functions(config)
    return score_texts(functions.score, sources, targets, batch_size, progress, batch_tokens,
                       functions.count_tokens, on_cut=self._warn_cut(config))

  def align(self, sources, *, batch_size: int | None = 64, batch_tokens: int | None = None,
            progress=None, first_index: int = 0, target_language: str | None = None,
            **search):
    """The best translation of each source (beam search) and its hard alignment (see
    `hard_alignment`); `search`, `first_index` (here only the numbering of an InputCutWarning)
    and `target_language` as in `translate`.

    Returns:
      (list of str, list of lists of (source piece, target piece) 0-based index pairs).
    """
    config = self.search_config(**search)
    functions = self.functions(config)
    sources = list(sources)
    tagged = self._tagged(sources, target_language)
    texts, alignments = align_texts(functions.align, tagged, batch_size, progress,
                                    batch_tokens, functions.count_tokens,
                                    on_cut=self._warn_cut(config, first_index))
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
