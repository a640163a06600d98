"""What a search may write next: filters applied to each step's logits, in order.

A search computes a step's logits [R, V] (R rows: B sentences x K hypotheses of a beam, or B
for sampling), then runs its `LogitFilters`: the transforms (which change the distribution a
row's scores come from: the repetition penalty), then the masks (which set a large negative
where a token may not come and leave the scores as they are: no end of sentence yet, phrases
to avoid, n-grams already written, a forced prefix). Every search (beam, constrained beam,
sampling) takes the same filters, in the graph and under XLA.

A filter is a frozen dataclass, fn(logits float32 [R, V], StepContext) -> logits [R, V], whose
`reads_ids` says whether it reads the tokens written so far.
"""

import dataclasses
from typing import NamedTuple

import tensorflow as tf

from tf_transformer.decoding.search_ops import NEG_INF, force_prefix


class StepContext(NamedTuple):
  """What the filters of a step may read.

  step: int32 scalar, the position of the token being chosen.
  ids: int32 [R, L], each row's tokens so far (0 from `step` on); None when no filter reads
    them.
  no_eos: bool scalar or [R, 1], the rows where EOS may not come yet.
  forced: bool [R], the rows whose token at `step` a prefix forces, or None (no prefix, or no
    filter that reads them).
  lexical: a constrained search's lexical_constraints.State of the rows, or None.
  """
  step: tf.Tensor
  ids: tf.Tensor
  no_eos: tf.Tensor
  forced: tf.Tensor | None = None
  lexical: object = None


@dataclasses.dataclass(frozen=True)
class NoEndYet:
  """EOS masked in the rows of `no_eos` (before min_decode_length, or before a constrained
  hypothesis has met its phrases)."""
  eos_id: int
  reads_ids = False

  def __call__(self, logits, context: StepContext):
    is_eos = tf.equal(tf.range(tf.shape(logits)[-1]), self.eos_id)[tf.newaxis]
    no_eos = context.no_eos
    # with nothing to mask (past min_decode_length, no constraint unmet), skip a [R, V] pass
    return tf.cond(tf.reduce_any(no_eos), lambda: tf.where(no_eos & is_eos, NEG_INF, logits),
                   lambda: logits)


@dataclasses.dataclass(frozen=True)
class ForcedPrefix:
  """Every token but the prefix's masked at its steps (search_ops.force_prefix): `prefix_ids`
  int32 [B, P], 0-padded; `rows_per_sentence` K."""
  prefix_ids: tf.Tensor
  rows_per_sentence: int
  reads_ids = False

  def __call__(self, logits, context: StepContext):
    return force_prefix(logits, self.prefix_ids, context.step, self.rows_per_sentence)

  def forced_rows(self, step):
    """bool [R]: the rows whose token at `step` the prefix forces."""
    padded = tf.pad(self.prefix_ids, [[0, 0], [0, 1]])
    forced = padded[:, tf.minimum(step, tf.shape(self.prefix_ids)[1])] > 0
    return tf.repeat(forced, self.rows_per_sentence)


def _written(context: StepContext):
  """bool [R, L]: the positions of each row's tokens so far."""
  return tf.range(tf.shape(context.ids)[1])[tf.newaxis] < context.step


def _unless_forced(filtered, logits, context: StepContext):
  """`filtered`, but `logits` in the rows a prefix forces (a prefix is written as given)."""
  if context.forced is None:
    return filtered
  return tf.where(context.forced[:, tf.newaxis], logits, filtered)


@dataclasses.dataclass(frozen=True)
class NoRepeatNgram:
  """No n-gram of target pieces twice in a row's output: a token that would end an n-gram the
  row has already written is masked (fairseq's --no-repeat-ngram-size; n 1: no piece twice)."""
  size: int
  reads_ids = True

  def __call__(self, logits, context: StepContext):
    n, ids, step = self.size, context.ids, context.step
    rows, length = tf.shape(ids)[0], tf.shape(ids)[1]
    starts = tf.maximum(length - n + 1, 0)  # the n-grams that fit in L, by their first token
    last = ids[:, n - 1:n - 1 + starts]  # each n-gram's last token [R, J]
    # written in full before `step` -> [R, J]
    repeats = tf.broadcast_to(tf.range(starts)[tf.newaxis] + n - 1 < step, tf.shape(last))
    if n > 1:
      # each n-gram's first n - 1 tokens [R, J, n - 1] against the row's last n - 1 [R, n - 1]
      # (positions before 0, clipped, end no n-gram written in full)
      heads = tf.stack([ids[:, k:k + starts] for k in range(n - 1)], axis=-1)
      tail = tf.gather(ids, tf.maximum(step - (n - 1) + tf.range(n - 1), 0), axis=1)
      repeats &= tf.reduce_all(tf.equal(heads, tail[:, tf.newaxis]), axis=-1)  # -> [R, J]
    rows_of = tf.broadcast_to(tf.range(rows)[:, tf.newaxis], tf.shape(last))
    indices = tf.reshape(tf.stack([rows_of, last], axis=-1), [-1, 2])
    # the least of the logit and NEG_INF at a repeat, of the logit and +max elsewhere
    values = tf.reshape(tf.where(repeats, NEG_INF, tf.float32.max), [-1])
    return _unless_forced(tf.tensor_scatter_nd_min(logits, indices, values), logits, context)


@dataclasses.dataclass(frozen=True)
class RepetitionPenalty:
  """The logit of a piece the row has already written divided by `penalty` if positive,
  multiplied by it if negative (CTRL's rule, Keskar et al. 2019, as CTranslate2 applies it):
  penalty > 1 discourages repeats, < 1 favours them. A transform: the scores are those of the
  penalised distribution."""
  penalty: float
  reads_ids = True

  def __call__(self, logits, context: StepContext):
    ids = context.ids
    rows_of = tf.broadcast_to(tf.range(tf.shape(ids)[0])[:, tf.newaxis], tf.shape(ids))
    indices = tf.reshape(tf.stack([rows_of, ids], axis=-1), [-1, 2])
    written = tf.reshape(tf.cast(tf.broadcast_to(_written(context), tf.shape(ids)), tf.int32),
                         [-1])
    seen = tf.tensor_scatter_nd_max(tf.zeros(tf.shape(logits), tf.int32), indices, written) > 0
    penalised = tf.where(logits > 0, logits / self.penalty, logits * self.penalty)
    return _unless_forced(tf.where(seen, penalised, logits), logits, context)


@dataclasses.dataclass(frozen=True)
class LogitFilters:
  """A search's filters: `transforms` change the distribution (before a row's log-probabilities
  are normalised), `masks` only mask (after), each in order."""
  transforms: tuple = ()
  masks: tuple = ()

  @property
  def reads_ids(self) -> bool:
    """Whether a filter reads the tokens written so far (a repetition control)."""
    return any(function.reads_ids for function in self.transforms + self.masks)

  def transform(self, logits, context: StepContext):
    for function in self.transforms:
      logits = function(logits, context)
    return logits

  def mask(self, logits, context: StepContext):
    for function in self.masks:
      logits = function(logits, context)
    return logits


@dataclasses.dataclass(frozen=True)
class RepetitionControls:
  """The repetition settings of a search (config.DecodeConfig's): `no_repeat_ngram_size` (0:
  off) and `repetition_penalty` (1: off)."""
  no_repeat_ngram_size: int = 0
  repetition_penalty: float = 1.0


def for_search(eos_id: int, rows_per_sentence: int, prefix_ids=None,
               repetition: RepetitionControls = RepetitionControls(),
               constraint_masks=()) -> LogitFilters:
  """The filters of a search, in the order they run: the repetition penalty; then EOS not yet,
  a constrained search's `constraint_masks`, no repeated n-gram, and the forced prefix last."""
  transforms, masks = [], [NoEndYet(eos_id), *constraint_masks]
  if repetition.repetition_penalty != 1.0:
    transforms.append(RepetitionPenalty(repetition.repetition_penalty))
  if repetition.no_repeat_ngram_size:
    masks.append(NoRepeatNgram(repetition.no_repeat_ngram_size))
  if prefix_ids is not None:
    masks.append(ForcedPrefix(prefix_ids, rows_per_sentence))
  return LogitFilters(tuple(transforms), tuple(masks))


def context(filters: LogitFilters, step, ids, no_eos, lexical=None) -> StepContext:
  """The StepContext of `filters` at `step`; `ids` a fn() -> int32 [R, L], called only when a
  filter reads them (with the rows a prefix forces, which the repetition controls leave be)."""
  if not filters.reads_ids:
    return StepContext(step, None, no_eos, None, lexical)
  prefixes = [function for function in filters.masks if isinstance(function, ForcedPrefix)]
  forced = prefixes[0].forced_rows(step) if prefixes else None
  return StepContext(step, ids(), no_eos, forced, lexical)
