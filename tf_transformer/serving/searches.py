"""The searches a Translator runs over token ids: a tf.function per decoding strategy, each
sentence's shortlist chosen inside it. XLA-compiled, a batch runs at its shape bucket
(xla_shapes.py). With in-graph batching too, a source is padded to a width of a short ladder
that the warm-ups compile at every allowed batch size, and a batch of a shape they did not
compile (more rows, a wide prefix or wide constraints) runs the search uncompiled: no request
waits seconds for XLA while the others queue behind it."""

import dataclasses
import functools

import tensorflow as tf

from tf_transformer import decoding
from tf_transformer.config import BatchingConfig, DecodeConfig
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
    batching: the Translator's config.BatchingConfig, or None.
    max_batch_size: the rows the Translator decodes at a time.

  Attributes:
    functions: {strategy: tf.function(ids, prefix_ids, seeds, constraints)}, jit-compiled with
      config.decode_jit.
    compiled_rows, widths: with batching and decode_jit, the row buckets and the source
      widths (xla_shapes.width_ladder) that the warm-ups compile; else () and None.
  """

  def __init__(self, model, config: DecodeConfig, shortlist_size: int = 0, table=None,
               order=None, batching: BatchingConfig | None = None, max_batch_size: int = 64):
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
    def functions(jit_compile):
      return {strategy: tf.function(functools.partial(search_ids, strategy),
                                    jit_compile=jit_compile, autograph=False)
              for strategy in strategies.STRATEGIES}

    self.functions = functions(config.decode_jit)
    self._uncompiled, self.compiled_rows, self.widths = None, (), None
    if batching is not None and config.decode_jit:
      self._uncompiled = functions(False)
      self.compiled_rows = xla_shapes.compiled_rows(batching.allowed_batch_sizes,
                                                    max_batch_size)
      self.widths = xla_shapes.width_ladder(config.max_source_length)

  def decode(self, source_ids, prefix_ids=None, seeds=None, strategy: str = "beam",
             constraints=None):
    """int32 [B, S] (optional forced prefixes int32 [B, P], int64 seeds [B] and
    lexical_constraints.Constraints, see decoding.decode) -> (ids int32 [B, N, L], scores
    float32 [B, N]), N the beam size (1 for sampling)."""
    search = self.functions[strategy]
    if not self.config.decode_jit:
      return search(source_ids, prefix_ids, seeds, constraints)
    size = self.config.max_constraint_tokens

    def compiled():
      return xla_shapes.bucketed_search(search, source_ids, prefix_ids, seeds, constraints,
                                        size, self.widths)

    if self._uncompiled is None:
      return compiled()
    return tf.cond(
        xla_shapes.at_compiled_shape(source_ids, prefix_ids, constraints, self.compiled_rows,
                                     size),
        compiled,
        lambda: self._uncompiled[strategy](source_ids, prefix_ids, seeds, constraints))
