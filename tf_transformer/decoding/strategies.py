"""The decoding strategies, chosen from a DecodeConfig in one place (`from_config`).

A strategy runs a whole search over one `symbols_to_logits_fn` (the model's cached decoder
step, or an ensemble's: `gives_log_probs`); it never imports a model. Each returns the same
thing: int32 ids [B, N, L] (N hypotheses per row, best first, EOS then 0s) and float32 scores
[B, N]. Every strategy applies the same logit filters (logit_filters.py): a minimum length, a
forced prefix, the repetition controls.
"""

import dataclasses

import tensorflow as tf

from tf_transformer.config import ConfigError
from tf_transformer.decoding import beam_search, constrained_search, logit_filters, sampling


@dataclasses.dataclass(frozen=True)
class BeamSearch:
  """The beam_size best outputs under a GNMT-normalized log-probability (a config's beam_size
  1 is GreedySearch)."""
  beam_size: int
  alpha: float
  repetition: logit_filters.RepetitionControls = logit_filters.RepetitionControls()

  @property
  def hypotheses(self) -> int:
    """N: the hypotheses returned per row."""
    return self.beam_size

  def __call__(self, symbols_to_logits_fn, initial_ids, initial_cache, *, max_decode_length,
               eos_id: int, min_decode_length, buffer_length, prefix_ids=None, seeds=None,
               gives_log_probs=False, constraints=None):
    del seeds, constraints  # deterministic; ConstrainedBeamSearch takes constraints
    return beam_search.beam_search(symbols_to_logits_fn, initial_ids, initial_cache,
                                   self.beam_size, self.alpha, max_decode_length, eos_id,
                                   min_decode_length, buffer_length, prefix_ids, gives_log_probs,
                                   self.repetition)


@dataclasses.dataclass(frozen=True)
class ConstrainedBeamSearch(BeamSearch):
  """Beam search whose outputs contain each positive phrase of their sentence's constraints
  and no negative one (constrained_search.py)."""

  def __call__(self, symbols_to_logits_fn, initial_ids, initial_cache, *, max_decode_length,
               eos_id: int, min_decode_length, buffer_length, prefix_ids=None, seeds=None,
               gives_log_probs=False, constraints=None):
    del seeds
    return constrained_search.constrained_beam_search(
        symbols_to_logits_fn, initial_ids, initial_cache, self.beam_size, self.alpha,
        max_decode_length, eos_id, constraints, min_decode_length=min_decode_length,
        buffer_length=buffer_length, prefix_ids=prefix_ids, gives_log_probs=gives_log_probs,
        repetition=self.repetition)


@dataclasses.dataclass(frozen=True)
class GreedySearch:
  """The most probable token at each step, one output per row: a config's beam_size 1, greedy
  as fairseq, CTranslate2 and transformers mean it. (A width-1 beam is not: it keeps an ended
  hypothesis from a step's second-best token, which may outscore the argmax's continuation.)
  Random sampling at temperature 0 draws the same tokens."""
  alpha: float
  repetition: logit_filters.RepetitionControls = logit_filters.RepetitionControls()

  @property
  def hypotheses(self) -> int:
    return 1

  def __call__(self, symbols_to_logits_fn, initial_ids, initial_cache, *, seeds=None,
               constraints=None, **search):
    del seeds, constraints  # deterministic; ConstrainedBeamSearch takes constraints
    argmax = RandomSampling(0, 1.0, 0.0, self.alpha, self.repetition)
    return argmax(symbols_to_logits_fn, initial_ids, initial_cache,
                  seeds=tf.zeros_like(initial_ids, tf.int64), **search)


@dataclasses.dataclass(frozen=True)
class RandomSampling:
  """One output per row drawn from the model's filtered distribution (see sampling)."""
  top_k: int
  top_p: float
  temperature: float
  alpha: float
  repetition: logit_filters.RepetitionControls = logit_filters.RepetitionControls()

  @property
  def hypotheses(self) -> int:
    return 1

  def __call__(self, symbols_to_logits_fn, initial_ids, initial_cache, *, max_decode_length,
               eos_id: int, min_decode_length, buffer_length, prefix_ids=None, seeds=None,
               gives_log_probs=False, constraints=None):
    if constraints is not None:
      raise ConstraintsNeedBeamError()
    if seeds is None:
      raise ValueError("random sampling needs a seed for each row")
    return sampling.sample(symbols_to_logits_fn, initial_ids, initial_cache, seeds,
                           max_decode_length, eos_id, top_k=self.top_k, top_p=self.top_p,
                           temperature=self.temperature, alpha=self.alpha,
                           min_decode_length=min_decode_length, buffer_length=buffer_length,
                           prefix_ids=prefix_ids, gives_log_probs=gives_log_probs,
                           repetition=self.repetition)


STRATEGIES = ("beam", "sample")  # config.CHOICES["strategy"]


class ConstraintsNeedBeamError(ConfigError):
  """Lexical constraints with random sampling: they need a beam search."""

  def __init__(self):
    super().__init__("lexical constraints need a beam search, not {strategy}", strategy="sample")


def check_constraints_allowed(config):
  """Raises ConstraintsNeedBeamError when `config` samples: the one place that refuses
  constraints with sampling, for the library and the tools alike."""
  if config.strategy == "sample":
    raise ConstraintsNeedBeamError()


def from_config(config, constrained: bool = False):
  """The strategy of a config.DecodeConfig; `constrained`: its beam search under lexical
  constraints (refused with sampling: `check_constraints_allowed`)."""
  repetition = logit_filters.RepetitionControls(config.no_repeat_ngram_size,
                                                config.repetition_penalty)
  if constrained:
    check_constraints_allowed(config)
    return ConstrainedBeamSearch(config.beam_size, config.alpha, repetition)
  if config.strategy == "sample":
    return RandomSampling(config.sampling_topk, config.sampling_topp,
                          config.sampling_temperature, config.alpha, repetition)
  if config.beam_size == 1:
    return GreedySearch(config.alpha, repetition)
  return BeamSearch(config.beam_size, config.alpha, repetition)
