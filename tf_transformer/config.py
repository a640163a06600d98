"""The frozen configs of a run (data, model, training, decoding) and the domains of their fields.

Every config checks its fields when it is built, from the tools' flags
(tf_transformer/bin/shared_flags.py, which takes the same domains) or from Python: a value
outside its domain is a `ConfigError` naming the field. It imports no TensorFlow and defines no
flags, so a program of the user's own can import the library beside its own flags.
"""

import dataclasses
import math

from common.errors import UserError


class ConfigError(UserError, ValueError):
  """A setting is missing, outside its domain or contradicts another; the message names it
  (as a template of fields, which the tools show as flags: common.errors.UserError)."""


def _in_unit_interval(value) -> bool:
  return 0.0 <= value < 1.0


def _finite_and(check):
  return lambda value: math.isfinite(value) and check(value)


# The real-valued fields' domains: (check, what a value must be).
REAL_DOMAINS = {
    "dropout_rate": (_in_unit_interval, "in [0, 1)"),
    "attention_dropout_rate": (_in_unit_interval, "in [0, 1)"),
    "relu_dropout_rate": (_in_unit_interval, "in [0, 1)"),
    "label_smoothing": (_in_unit_interval, "in [0, 1)"),
    "ema_decay": (_in_unit_interval, "in [0, 1) (0: no moving average)"),
    "learning_rate": (_finite_and(lambda value: value > 0.0), "a finite number > 0"),
    "clip_norm": (_finite_and(lambda value: value >= 0.0), "a finite number >= 0 (0: off)"),
    "rdrop_alpha": (_finite_and(lambda value: value >= 0.0), "a finite number >= 0 (0: off)"),
    "train_minutes": (_finite_and(lambda value: value >= 0.0), "a finite number >= 0 (0: off)"),
    "alpha": (_finite_and(lambda value: value >= 0.0), "a finite number >= 0"),
    "subword_alpha": (_finite_and(lambda value: 0.0 <= value <= 1.0), "in [0, 1] (0: off)"),
    "source_token_dropout": (_in_unit_interval, "in [0, 1) (0: off)"),
    "sampling_topp": (_finite_and(lambda value: 0.0 < value <= 1.0), "in (0, 1]"),
    "sampling_temperature": (_finite_and(lambda value: value >= 0.0),
                             "a finite number >= 0 (0: the most probable token)"),
    "repetition_penalty": (_finite_and(lambda value: value > 0.0),
                           "a finite number > 0 (1: off; > 1 discourages repeats)"),
    "layer_norm_epsilon": (_finite_and(lambda value: value > 0.0), "a finite number > 0"),
}

# The integer fields' ranges: (lowest, highest or None).
INTEGER_RANGES = {
    "max_length": (1, None), "vocab_size": (16, None), "spm_input_sentences": (1, None),
    "batch_tokens": (1, None), "shuffle_buffer": (1, None), "subword_nbest_size": (-1, None),
    "source_vocab_size": (1, None), "target_vocab_size": (1, None),
    "num_layers": (1, None), "max_relative_position": (0, None), "d_model": (1, None), "num_heads": (1, None), "d_ff": (1, None),
    "train_steps": (1, None), "warmup_steps": (1, None), "eval_every": (1, None),
    "save_every": (1, None), "keep_checkpoints": (1, None), "eval_sentences": (0, None),
    "eval_batch_size": (1, None), "eval_beam_size": (1, None), "early_stopping": (0, None),
    "seed": (0, 2**32 - 1), "num_cpu_devices": (1, None), "max_nonfinite_steps": (1, None),
    "update_freq": (1, None), "average_last": (0, None),
    "beam_size": (1, None), "nbest": (1, None), "extra_decode_length": (1, None),
    "max_source_length": (1, None), "min_decode_length": (0, None),
    "max_decode_length": (0, None), "sampling_topk": (0, None),
    "max_constraint_tokens": (1, None), "no_repeat_ngram_size": (0, None),
    "batch_size": (1, None),  # the tools' decoding batches (no config's field)
    "max_batch_size": (1, None), "batch_timeout_micros": (0, None),
    "num_batch_threads": (1, None), "max_enqueued_batches": (1, None),
}

# The string fields' choices.
CHOICES = {
    "spm_model_type": ("unigram", "bpe"),
    "subword_sides": ("both", "source", "target"),
    "on_bad_line": ("error", "skip"),
    "norm_position": ("post", "pre"),  # layers.residual.NORM_POSITIONS
    "position_encoding": ("sinusoidal", "relative"),
    "sinusoid_layout": ("interleaved", "halves"),  # layers.embedding.SINUSOID_LAYOUTS
    "activation": ("relu", "swish", "gelu"),  # layers.feed_forward.ACTIVATIONS
    "distribution": ("default", "mirrored", "multi_worker", "tpu"),
    "on_nonfinite": ("stop", "skip"),
    "mixed_precision": ("auto", "float32", "mixed_float16", "mixed_bfloat16"),
    "strategy": ("beam", "sample"),  # strategies.STRATEGIES
    # an export's weights: the names of layers.precisions.PRECISIONS (here, to be read before
    # TensorFlow loads)
    "precision": ("float32", "bfloat16", "int8"),
}


def _check_domains(config):
  """Raises ConfigError for the first field of `config` outside its domain."""
  for field in dataclasses.fields(config):
    name, value = field.name, getattr(config, field.name)
    if name in REAL_DOMAINS:
      check, domain = REAL_DOMAINS[name]
      ok = isinstance(value, (int, float)) and not isinstance(value, bool) and check(value)
    elif name in INTEGER_RANGES:
      low, high = INTEGER_RANGES[name]
      domain = f"an integer >= {low}" + (f" and <= {high}" if high is not None else "")
      ok = (isinstance(value, int) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))
    elif name in CHOICES:
      domain = "one of " + ", ".join(CHOICES[name])
      ok = value in CHOICES[name]
    else:
      continue
    if not ok:
      raise ConfigError(f"{type(config).__name__}: {name}={value!r} must be {domain}")


class _Checked:
  """A config whose fields are checked against their domains when it is built."""

  def __post_init__(self):
    _check_domains(self)


def target_languages(tgt_lang: str) -> tuple[str, ...]:
  """tgt_lang's languages: "de" -> ("de",); "de,fr,cs" -> ("de", "fr", "cs")."""
  return tuple(lang.strip() for lang in tgt_lang.split(","))


def train_weights_problem(weights: tuple, num_corpora: int,
                          prefix_name: str = "train_prefix") -> str | None:
  """What is wrong with train_weights `weights` for `num_corpora` training corpora (named by
  `prefix_name` in the message), or None: () or one finite number >= 0 each, not all 0."""
  if not weights or (len(weights) == num_corpora and all(
      isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0
      for weight in weights) and sum(weights) > 0):
    return None
  return f"a finite number >= 0 for each of the {num_corpora} {prefix_name} corpora, not all 0"


@dataclasses.dataclass(frozen=True)
class DataConfig(_Checked):
  """Where the corpora are and how they become batches.

  train_prefix: the training corpora, comma-separated ({data_dir}/{prefix}.{lang} files, or a
  TFDS dataset's splits). train_weights: with several, each corpus's share of the pairs drawn
  for training (any scale; each corpus repeats on its own, so a small one weighted up is
  seen again and again); () draws in proportion to the corpora's pairs, as if concatenated.
  tgt_lang: one target language, or several comma-separated (de,fr,cs): one multilingual model
  (Johnson et al. 2017) whose sources carry a target-language token (language_tags.py), with
  one SentencePiece model over every language and each language's corpora
  {prefix}.{src_lang} / {prefix}.{lang} for each prefix.
  spm_byte_fallback: the SentencePiece models write a character they keep no piece for as its
  UTF-8 bytes (256 pieces of the vocabulary) instead of <unk>.
  subword_alpha > 0: subword regularization (Kudo 2018), each training sentence segmented anew
  each time it is read, sampled by SentencePiece from its subword_nbest_size best segmentations
  (-1: from all of them) with probabilities sharpened by subword_alpha (a BPE model drops merges
  with probability subword_alpha instead); dev, test and translation stay deterministic.
  subword_sides: the sides sampled so ("both", "source" or "target"); the other side keeps its
  one best segmentation.
  source_token_dropout > 0: each training source piece (not EOS, not a multilingual model's
  language token) becomes <unk> with this probability, drawn anew each time it is read.
  """
  data_dir: str | None = None
  dataset: str = ""
  tfds_data_dir: str | None = None
  src_lang: str = "en"
  tgt_lang: str = "de"
  train_prefix: str = "train"
  train_weights: tuple[float, ...] = ()
  dev_prefix: str | None = "val"
  test_prefix: str | None = None
  max_length: int = 100
  vocab_size: int = 8000
  spm_model_type: str = "unigram"
  spm_byte_fallback: bool = False
  shared_vocab: bool = True
  spm_input_sentences: int = 2_000_000
  on_bad_line: str = "error"
  batch_tokens: int = 4096
  shuffle_buffer: int = 100_000
  subword_alpha: float = 0.0
  subword_nbest_size: int = -1
  subword_sides: str = "both"
  source_token_dropout: float = 0.0

  def __post_init__(self):
    super().__post_init__()
    if self.subword_alpha > 0 and self.subword_nbest_size in (0, 1):
      raise ConfigError(f"DataConfig: subword_nbest_size={self.subword_nbest_size} leaves one "
                        "segmentation to sample from: -1 (all) or >= 2 with subword_alpha > 0")
    languages = target_languages(self.tgt_lang)
    if len(languages) > 1:
      problem = None
      if not all(languages) or len(set(languages)) != len(languages):
        problem = "distinct, non-empty, comma-separated languages"
      elif self.src_lang in languages:
        problem = f"languages other than the source's ({self.src_lang})"
      elif not self.shared_vocab:
        problem = "trained with {shared_vocab:name} (one subword model over every language)"
      elif self.dataset:
        problem = "read from text files ({data_dir:name}), not a TFDS dataset"
      if problem:
        raise ConfigError(f"DataConfig: tgt_lang={self.tgt_lang!r}: several target languages "
                          f"must be {problem}", shared_vocab=None, data_dir=None)
    prefixes = self.train_prefix.split(",")
    if not all(prefix.strip() for prefix in prefixes):
      raise ConfigError(f"DataConfig: train_prefix={self.train_prefix!r} must be one or more "
                        "comma-separated corpus names, none empty")
    corpora = [f"{prefix}.{lang}" for lang in languages for prefix in prefixes]
    problem = train_weights_problem(self.train_weights, len(corpora))
    if problem:
      raise ConfigError(f"DataConfig: train_weights={list(self.train_weights)} must be "
                        f"{problem} ({', '.join(corpora)})")

  @property
  def train_prefixes(self) -> tuple[str, ...]:
    """The training corpora's names, in train_prefix's order."""
    return tuple(prefix.strip() for prefix in self.train_prefix.split(","))

  @property
  def tgt_langs(self) -> tuple[str, ...]:
    """The target languages, in tgt_lang's order (more than one: a multilingual model)."""
    return target_languages(self.tgt_lang)


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Checked):
  """Architecture; the field names are the Transformer's constructor arguments.

  The defaults are the paper's model. The other values of activation, projection_biases,
  layer_norm_epsilon, output_bias, sinusoid_layout and scale_embeddings hold the published
  models of other toolkits (a Marian model: swish, biases, 1e-5, an output bias, sines and
  cosines in halves; bin/import_marian.py).
  """
  source_vocab_size: int
  target_vocab_size: int
  shared_vocab: bool = True
  num_layers: int = 6
  d_model: int = 512
  num_heads: int = 8
  d_ff: int = 2048
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  relu_dropout_rate: float = 0.1
  norm_position: str = "post"
  skip_padding: bool = True
  position_encoding: str = "sinusoidal"
  max_relative_position: int = 0
  activation: str = "relu"
  projection_biases: bool = False
  layer_norm_epsilon: float = 1e-6
  output_bias: bool = False
  sinusoid_layout: str = "interleaved"
  scale_embeddings: bool = True

  def __post_init__(self):
    super().__post_init__()
    if self.d_model % self.num_heads or self.d_model % 2:
      raise ConfigError(f"ModelConfig: d_model={self.d_model} must be even and divisible by "
                        f"num_heads={self.num_heads}")
    if (self.position_encoding == "relative") != (self.max_relative_position > 0):
      raise ConfigError(f"ModelConfig: max_relative_position={self.max_relative_position} "
                        "must be >= 1 with position_encoding=relative and 0 with sinusoidal, "
                        f"not with {self.position_encoding}")


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Checked):
  """The optimisation loop, evaluation and checkpointing."""
  model_dir: str
  train_steps: int = 100_000
  train_minutes: float = 0.0
  warmup_steps: int = 4000
  learning_rate: float = 1.0
  label_smoothing: float = 0.1
  rdrop_alpha: float = 0.0
  clip_norm: float = 0.0
  eval_every: int = 1000
  save_every: int = 1000
  keep_checkpoints: int = 5
  eval_sentences: int = 1000
  eval_batch_size: int = 64
  eval_beam_size: int = 4
  early_stopping: int = 0
  seed: int = 1234
  deterministic: bool = False
  distribution: str = "default"
  num_cpu_devices: int = 1
  tpu: str = ""
  on_nonfinite: str = "stop"
  max_nonfinite_steps: int = 10
  update_freq: int = 1
  mixed_precision: str = "float32"
  jit_compile: bool = False
  ema_decay: float = 0.0
  average_last: int = 3
  profile_steps: tuple[int, int] | tuple[()] = ()


@dataclasses.dataclass(frozen=True)
class DecodeConfig(_Checked):
  """The search of translation, evaluation and an export, passed whole (strategies.from_config
  turns it into a search).

  strategy: "beam" (beam_size 1: greedy) or "sample" (random sampling: one draw per output,
  from softmax(logits / sampling_temperature) restricted to the sampling_topk most probable
  tokens (0: all) and then to the smallest set of them whose probability reaches
  sampling_topp; seed makes the draws repeatable). nbest: outputs per source, at most
  beam_size for a beam search; independent samples for sampling. max_source_length: inputs
  (and forced prefixes, scored targets) are cut to this many subword pieces.
  min_decode_length, max_decode_length: optional fixed bounds of an output's length (0: none;
  without max_decode_length, a sentence gets its source length + extra_decode_length tokens).
  max_constraint_tokens: the most subword pieces of a sentence's positive constraints, and of
  each of its negative phrases, and the most negative phrases (the widest shapes of a compiled
  constrained search). no_repeat_ngram_size: no n-gram of target pieces twice in an output (0:
  off); repetition_penalty: the logit of a piece already written divided by it if positive,
  multiplied if negative (1: off); both for every strategy (decoding/logit_filters.py).
  """
  strategy: str = "beam"
  beam_size: int = 4
  alpha: float = 0.6
  nbest: int = 1
  sampling_topk: int = 0
  sampling_topp: float = 1.0
  sampling_temperature: float = 1.0
  seed: int = 1234
  max_source_length: int = 100
  extra_decode_length: int = 50
  min_decode_length: int = 0
  max_decode_length: int = 0
  decode_jit: bool = False
  max_constraint_tokens: int = 32
  no_repeat_ngram_size: int = 0
  repetition_penalty: float = 1.0

  def __post_init__(self):
    super().__post_init__()
    if self.strategy == "beam" and self.nbest > self.beam_size:
      raise ConfigError(f"DecodeConfig: nbest={self.nbest} must be at most "
                        f"beam_size={self.beam_size}")
    if self.max_decode_length and self.min_decode_length > self.max_decode_length:
      raise ConfigError(f"DecodeConfig: min_decode_length={self.min_decode_length} must be at "
                        f"most max_decode_length={self.max_decode_length}")

  @property
  def search_key(self) -> "DecodeConfig":
    """This config with the fields that do not change a compiled search (strategy, nbest,
    seed) at their defaults: one Translator serves every config of the same key."""
    return dataclasses.replace(self, strategy="beam", nbest=1, seed=0)


@dataclasses.dataclass(frozen=True)
class BatchingConfig(_Checked):
  """In-graph batching of a SavedModel's signatures (TensorFlow's BatchFunction op): the
  requests that concurrent callers make of one signature are merged into one search, in any
  runtime that loads the SavedModel (translator.Translator).

  max_batch_size: the most rows of one merged batch; a request of more rows runs alone,
  unbatched. allowed_batch_sizes: a merged batch is padded up to the next of these (one XLA
  compilation each, made by the warm-up requests); the last must be max_batch_size; () gives
  the powers of two below it and max_batch_size itself. batch_timeout_micros: how long an
  open batch waits for more requests while a batch thread is free (requests that arrive while
  every thread is busy wait anyway, and join the next batch). num_batch_threads: batches
  decoded side by side. max_enqueued_batches: closed batches waiting for a thread; beyond
  that a request fails at once (the server is overloaded) instead of queueing for longer.
  """
  max_batch_size: int = 32
  allowed_batch_sizes: tuple[int, ...] = ()
  batch_timeout_micros: int = 0
  num_batch_threads: int = 1
  max_enqueued_batches: int = 64

  def __post_init__(self):
    super().__post_init__()
    sizes = tuple(self.allowed_batch_sizes) or tuple(
        2 ** i for i in range(self.max_batch_size.bit_length())
        if 2 ** i < self.max_batch_size) + (self.max_batch_size,)
    if (any(not isinstance(size, int) or size < 1 for size in sizes)
        or list(sizes) != sorted(set(sizes)) or sizes[-1] != self.max_batch_size):
      raise ConfigError(f"BatchingConfig: allowed_batch_sizes={list(sizes)} must be increasing "
                        f"positive integers ending with max_batch_size={self.max_batch_size}")
    object.__setattr__(self, "allowed_batch_sizes", sizes)
