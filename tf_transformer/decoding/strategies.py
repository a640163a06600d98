"""The decoding strategies, chosen from a DecodeConfig in one place (`from_config`).

A strategy runs a whole search over one `symbols_to_logits_fn` (the model's cached decoder
step, or an ensemble's: `gives_log_probs`); it never imports a model. Each returns the same
thing: int32 ids [B, N, L] (N hypotheses per row, best first, EOS then 0s) and float32 scores
[B, N].
"""

import dataclasses

from tf_transformer.decoding import beam_search
from tf_transformer.decoding import sampling


@dataclasses.dataclass(frozen=True)
class BeamSearch:
  """The beam_size best outputs under a GNMT-normalized log-probability (beam_size 1:
  greedy, see beam_search)."""
  beam_size: int
  alpha: float

  @property
  def hypotheses(self) -> int:
    """N: the hypotheses returned per row."""
    return self.beam_size

  def __call__(self, symbols_to_logits_fn, initial_ids, initial_cache, *, max_decode_length,
               eos_id: int, min_decode_length, buffer_length, prefix_ids=None, seeds=None,
               gives_log_probs=False, constraints=None):
    del seeds  # deterministic
    return beam_search.beam_search(symbols_to_logits_fn, initial_ids, initial_cache,
                                   self.beam_size, self.alpha, max_decode_length, eos_id,
                                   min_decode_length, buffer_length, prefix_ids, gives_log_probs,
                                   constraints)


@dataclasses.dataclass(frozen=True)
class RandomSampling:
  """One output per row drawn from the model's filtered distribution (see sampling)."""
  top_k: int
  top_p: float
  temperature: float
  alpha: float

  @property
  def hypotheses(self) -> int:
    return 1

  def __call__(self, symbols_to_logits_fn, initial_ids, initial_cache, *, max_decode_length,
               eos_id: int, min_decode_length, buffer_length, prefix_ids=None, seeds=None,
               gives_log_probs=False, constraints=None):
    if seeds is None:
      raise ValueError("random sampling needs a seed for each row")
    if constraints is not None:
      raise ValueError("lexical constraints need beam search (--strategy=beam)")
    return sampling.sample(symbols_to_logits_fn, initial_ids, initial_cache, seeds,
                           max_decode_length, eos_id, top_k=self.top_k, top_p=self.top_p,
                           temperature=self.temperature, alpha=self.alpha,
                           min_decode_length=min_decode_length, buffer_length=buffer_length,
                           prefix_ids=prefix_ids, gives_log_probs=gives_log_probs)


STRATEGIES = ("beam", "sample")  # config.CHOICES["strategy"]


def from_config(config):
  """The strategy of a config.DecodeConfig."""
  if config.strategy == "sample":
    return RandomSampling(config.sampling_topk, config.sampling_topp,
                          config.sampling_temperature, config.alpha)
  return BeamSearch(config.beam_size, config.alpha)
