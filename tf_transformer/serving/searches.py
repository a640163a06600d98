"""The searches a Translator runs over token ids: a tf.function per decoding strategy, each
sentence's shortlist chosen inside it; XLA-compiled, a batch runs at its shape bucket
(xla_shapes.py)."""

import dataclasses
import functools

import tensorflow as tf

from tf_transformer import decoding
from tf_transformer.config import DecodeConfig
from tf_transformer.decoding import shortlist as shortlist_lib
from tf_transformer.decoding import strategies
from tf_transformer.serving import xla_shapes


class Searches:
  """decoding.decode of `model` for each strategy, as a Translator runs it.

  Args:
    model: a Transformer or an ensemble.Ensemble.
    config: config.DecodeConfig (its strategy is replaced by each strategy's).
    shortlist_size: 0, or the target pieces of each sentence's shortlist, chosen from the
      variables `table` and `order` (shortlist.select).

  Attributes:
    functions: {strategy: tf.function(ids, prefix_ids, seeds, constraints)}, jit-compiled with
      config.decode_jit.
  """

  def __init__(self, model, config: DecodeConfig, shortlist_size: int = 0, table=None,
               order=None):
    self.config = config

    def search_ids(strategy, ids, prefix_ids=None, seeds=None, constraints=None):
      shortlist = None
      if shortlist_size:  # each sentence's own: its batch changes nothing of its translation
        forced = [t for t in (prefix_ids, constraints and constraints.tokens) if t is not None]
        shortlist = shortlist_lib.select(table, order, ids, shortlist_size,
                                         tf.concat(forced, axis=1) if forced else None)
      search = dataclasses.replace(config, strategy=strategy)
      return decoding.decode(model, ids, search, prefix_ids, shortlist, seeds, constraints)

    # no AutoGraph inside the search: it is plain TensorFlow ops (converting the model's code
    # made up much of a small run's start-up)
    self.functions = {strategy: tf.function(functools.partial(search_ids, strategy),
                                            jit_compile=config.decode_jit, autograph=False)
                      for strategy in strategies.STRATEGIES}

  def decode(self, source_ids, prefix_ids=None, seeds=None, strategy: str = "beam",
             constraints=None):
    """int32 [B, S] (optional forced prefixes int32 [B, P], int64 seeds [B] and
    lexical_constraints.Constraints, see decoding.decode) -> (ids int32 [B, N, L], scores
    float32 [B, N]), N the beam size (1 for sampling)."""
    search = self.functions[strategy]
    if not self.config.decode_jit:
      return search(source_ids, prefix_ids, seeds, constraints)
    return xla_shapes.bucketed_search(search, source_ids, prefix_ids, seeds, constraints,
                                      self.config.max_constraint_tokens)
