"""Vocabulary shortlists for a search: the target ids each sentence may write, chosen in-graph
from a lexicon (data_pipeline/lexical_shortlist.py), and its logits spread back over the
vocabulary.

At one sentence per request a decoding step multiplies 1 to 4 rows by every matrix, and the
output projection (d_model x V) is the largest of them. A search given shortlists of n ids
(decoding.decode) multiplies each sentence's rows by its own n columns only and its
log-softmax is taken over them, as Marian's lexical shortlists do. Each sentence has its own
shortlist, so its translation does not depend on the other sentences of its batch (a merged
batch of concurrent requests, or a file decoded 32 lines at a time, gives what one sentence
alone gives), and a batch of B sentences multiplies by B * n columns, not by the union of
their shortlists for every row.
"""

import tensorflow as tf

from data_pipeline.token_ids import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.layers.attention_bias import large_negative

# a target id's tier is the sum of its marks: each tier outranks the ones below it, and within
# a tier the more frequent id comes first
LEXICAL = 1  # a lexicon candidate of one of the sentence's source pieces
FORCED = 2  # a piece of a forced prefix: outside the shortlist it could not be forced
END = 4  # EOS: every sentence must be able to end
_TIERS = range(LEXICAL + FORCED + END, -2, -1)  # highest first; -1: PAD and BOS


def _marked(ids, mask, value: int, vocab_size: int):
  """int32 [B, vocab_size]: in row b, `value` at the ids of ids[b] (int32 [B, ...]) whose
  `mask` (bool, as ids) is true, 0 elsewhere."""
  batch = tf.shape(ids)[0]
  ids = tf.reshape(ids, [batch, -1])
  rows = tf.broadcast_to(tf.range(batch)[:, tf.newaxis], tf.shape(ids))
  return tf.tensor_scatter_nd_max(tf.zeros([batch, vocab_size], tf.int32),
                                  tf.stack([rows, ids], axis=-1),
                                  tf.where(tf.reshape(mask, tf.shape(ids)), value, 0))


def _ranks_that_fit(candidates, rank, real, fixed, room):
  """int32 [B]: for each sentence, the most ranks r (1 <= r <= k) such that the distinct ids
  among its source pieces' candidates of rank below r fit in its `room` (int32 [B]) places; 1
  when even the best ones do not (the most frequent of them go in).

  candidates, rank: int32 [B, S, k], each candidate and its rank among its source piece's;
  real: bool [B, S, k], false at padding; fixed: int32 [vocab_size], nonzero at the ids placed
  by their own tier (EOS, PAD, BOS), which take no room here.
  """
  batch, k, vocab_size = tf.shape(candidates)[0], candidates.shape[-1], fixed.shape[0]
  ids = tf.reshape(candidates, [batch, -1])
  rows = tf.broadcast_to(tf.range(batch)[:, tf.newaxis], tf.shape(ids))
  best = tf.tensor_scatter_nd_min(  # each id's best rank in the sentence, k: none
      tf.fill([batch, vocab_size], k), tf.stack([rows, ids], axis=-1),
      tf.reshape(tf.where(real, rank, k), [batch, -1]))  # -> [B, vocab_size]
  best = tf.where(tf.equal(fixed, 0), best, k)
  rows = tf.broadcast_to(tf.range(batch)[:, tf.newaxis], tf.shape(best))
  per_rank = tf.tensor_scatter_nd_add(tf.zeros([batch, k + 1], tf.int32),
                                      tf.stack([rows, best], axis=-1), tf.ones_like(best))
  fits = tf.cumsum(per_rank[:, :k], axis=1) <= room[:, tf.newaxis]  # -> [B, k]
  return tf.maximum(tf.reduce_sum(tf.cast(fits, tf.int32), axis=1), 1)


def select(table, order, source_ids, size, forced_ids=None):
  """Each sentence's shortlist: its `size` target ids of highest tier, the more frequent first
  within a tier.

  EOS first, then the pieces of the sentence's forced prefix, then the lexicon's candidates
  of its source pieces (PAD excluded), then the most frequent target pieces; PAD and BOS,
  which no output contains, only when every other id is in. No sort: each id's place follows
  from cumulative sums over `order`.

  When a sentence's candidates outnumber its shortlist, each source piece brings only its
  best r candidates, r as large as lets them all in (at least 1): a rare source word keeps its
  translation instead of losing it to the frequent candidates of the others. Otherwise every
  candidate is in.

  Args:
    table: int32 [source_vocab_size, k], each source id's lexicon candidates (Lexicon.table).
    order: int32 [target_vocab_size], the target ids most frequent first (Lexicon.order).
    source_ids: int32 [B, S], PAD_ID-padded.
    size: 2 <= size <= target_vocab_size, a Python int (static, as XLA needs it).
    forced_ids: optional int32 [B, P], PAD_ID-padded target ids that the search must be able
      to write (a forced prefix).

  Returns:
    int32 [B, size]: each row distinct target ids, highest tier first.
  """
  vocab_size = order.shape[0]
  batch = tf.shape(source_ids)[0]
  candidates = tf.gather(table, source_ids)  # -> [B, S, k]
  real = tf.broadcast_to(tf.not_equal(source_ids, PAD_ID)[:, :, tf.newaxis],
                         tf.shape(candidates))
  fixed = tf.tensor_scatter_nd_update(tf.zeros([vocab_size], tf.int32),
                                      [[EOS_ID], [PAD_ID], [BOS_ID]], [END, -1, -1])
  room = tf.fill([batch], size - 1)  # all but EOS
  if forced_ids is not None:
    forced = tf.not_equal(forced_ids, PAD_ID)
    room -= tf.reduce_sum(tf.cast(forced, tf.int32), axis=1)
  rank = tf.broadcast_to(tf.range(table.shape[1]), tf.shape(candidates))  # -> [B, S, k]
  kept = rank < _ranks_that_fit(candidates, rank, real, fixed, room)[:, tf.newaxis, tf.newaxis]
  tier = _marked(candidates, real & kept, LEXICAL, vocab_size)
  if forced_ids is not None:
    tier += _marked(forced_ids, forced, FORCED, vocab_size)
  tier = tf.where(tf.equal(fixed, 0), tier, fixed)  # -> [B, vocab_size]
  order = tf.convert_to_tensor(order)
  tier_in_order = tf.gather(tier, order, axis=1)
  place = tf.zeros([batch, vocab_size], tf.int32)
  before = tf.zeros([batch, 1], tf.int32)
  for level in _TIERS:
    here = tf.cast(tf.equal(tier_in_order, level), tf.int32)
    place = tf.where(here > 0, before + tf.cumsum(here, axis=1) - 1, place)
    before += tf.reduce_sum(here, axis=1, keepdims=True)
  place = tf.minimum(place, size)  # past the shortlist: one slot, dropped
  rows = tf.broadcast_to(tf.range(batch)[:, tf.newaxis], [batch, vocab_size])
  chosen = tf.tensor_scatter_nd_update(tf.zeros([batch, size + 1], tf.int32),
                                       tf.stack([rows, place], axis=-1),
                                       tf.broadcast_to(order, [batch, vocab_size]))
  return chosen[:, :size]


def vocabulary_positions(shortlists, vocab_size: int):
  """int32 [B, vocab_size]: each target id's position in its row of `shortlists` (int32
  [B, n], distinct ids in a row), n for the ids outside it (the large-negative column
  `spread` adds)."""
  batch, count = tf.shape(shortlists)[0], tf.shape(shortlists)[1]
  rows = tf.broadcast_to(tf.range(batch)[:, tf.newaxis], tf.shape(shortlists))
  return tf.tensor_scatter_nd_update(
      tf.fill([batch, vocab_size], count), tf.stack([rows, shortlists], axis=-1),
      tf.broadcast_to(tf.range(count), tf.shape(shortlists)))


def spread(logits, positions):
  """float32 [B * K, n] logits over the shortlists -> float32 [B * K, vocab_size].

  Rows b * K ... b * K + K - 1 (a sentence's K hypotheses) are over sentence b's shortlist:
  each logit goes to its target id, a large negative to the ids outside the shortlist (whose
  softmax weight is then 0). `positions`: int32 [B, vocab_size], `vocabulary_positions` of
  the shortlists."""
  batch = tf.shape(positions)[0]
  by_sentence = tf.reshape(logits, [batch, -1, tf.shape(logits)[1]])  # -> [B, K, n]
  filler = tf.fill(tf.concat([tf.shape(by_sentence)[:2], [1]], axis=0),
                   large_negative(tf.float32))
  spread_logits = tf.gather(tf.concat([by_sentence, filler], axis=2), positions, axis=2,
                            batch_dims=1)  # -> [B, K, vocab_size]
  return tf.reshape(spread_logits, [-1, tf.shape(positions)[1]])
