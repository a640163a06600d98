"""Vocabulary shortlists for a search: the target ids a batch may write, chosen in-graph from a
lexicon (data_pipeline/lexical_shortlist.py), and its logits spread back over the vocabulary.

At one sentence per request a decoding step multiplies 1 to 4 rows by every matrix, and the
output projection (d_model x V) is the largest of them. A search given a shortlist of n ids
(decoding.decode) multiplies by those n columns only and its log-softmax is taken over them,
as CTranslate2's vocabulary map and Marian's lexical shortlists do. One shortlist serves a
whole batch: the union of what its sentences need (the caller sizes it by the batch).
"""

import tensorflow as tf

from data_pipeline.token_ids import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.layers.attention_bias import large_negative

# a target id's tier is the sum of its marks: each tier outranks the ones below it, and within
# a tier the more frequent id comes first
LEXICAL = 1  # a lexicon candidate of one of the batch's source pieces
FORCED = 2  # a piece of a forced prefix: outside the shortlist it could not be forced
END = 4  # EOS: every sentence must be able to end
_TIERS = range(LEXICAL + FORCED + END, -2, -1)  # highest first; -1: PAD and BOS


def _marked(ids, mask, value: int, vocab_size: int):
  """int32 [vocab_size]: `value` at the ids (int32 [...]) whose `mask` (bool [...]) is true,
  0 elsewhere."""
  return tf.tensor_scatter_nd_max(tf.zeros([vocab_size], tf.int32), tf.reshape(ids, [-1, 1]),
                                  tf.reshape(tf.where(mask, value, 0), [-1]))


def select(table, order, source_ids, size, forced_ids=None):
  """The shortlist of a batch: its `size` target ids of highest tier, the more frequent first
  within a tier.

  EOS first, then the pieces of `forced_ids`, then the lexicon's candidates of the batch's
  source pieces (PAD excluded), then the most frequent target pieces; PAD and BOS, which no
  output contains, only when every other id is in. No sort: each id's place follows from
  cumulative sums over `order`.

  Args:
    table: int32 [source_vocab_size, k], each source id's lexicon candidates (Lexicon.table).
    order: int32 [target_vocab_size], the target ids most frequent first (Lexicon.order).
    source_ids: int32 [B, S], PAD_ID-padded.
    size: 2 <= size <= target_vocab_size: a Python int (static, as XLA needs it) or an int32
      scalar.
    forced_ids: optional int32 [B, P], PAD_ID-padded target ids that the search must be able
      to write (a forced prefix).

  Returns:
    int32 [size]: distinct target ids, highest tier first.
  """
  vocab_size = order.shape[0]
  candidates = tf.gather(table, source_ids)  # -> [B, S, k]
  real = tf.broadcast_to(tf.not_equal(source_ids, PAD_ID)[:, :, tf.newaxis],
                         tf.shape(candidates))
  tier = _marked(candidates, real, LEXICAL, vocab_size)
  if forced_ids is not None:
    tier += _marked(forced_ids, tf.not_equal(forced_ids, PAD_ID), FORCED, vocab_size)
  tier += tf.one_hot(EOS_ID, vocab_size, on_value=END, off_value=0, dtype=tf.int32)
  tier = tf.tensor_scatter_nd_update(tier, [[PAD_ID], [BOS_ID]], [-1, -1])
  order = tf.convert_to_tensor(order)
  tier_in_order = tf.gather(tier, order)
  place = tf.zeros([vocab_size], tf.int32)
  before = tf.constant(0)
  for level in _TIERS:
    here = tf.equal(tier_in_order, level)
    place = tf.where(here, before + tf.cumsum(tf.cast(here, tf.int32)) - 1, place)
    before += tf.reduce_sum(tf.cast(here, tf.int32))
  place = tf.minimum(place, size)  # past the shortlist: one slot, dropped
  chosen = tf.tensor_scatter_nd_update(tf.zeros([size + 1], tf.int32), place[:, tf.newaxis],
                                       order)
  return chosen[:size]


def vocabulary_positions(shortlist, vocab_size: int):
  """int32 [vocab_size]: each target id's position in `shortlist` (int32 [n], distinct ids),
  n for the ids outside it (the large-negative column `spread` adds)."""
  count = tf.shape(shortlist)[0]
  return tf.tensor_scatter_nd_update(tf.fill([vocab_size], count), shortlist[:, tf.newaxis],
                                     tf.range(count))


def spread(logits, positions):
  """float32 [rows, n] logits over a shortlist -> float32 [rows, vocab_size]: each at its
  target id, a large negative at the ids outside the shortlist (whose softmax weight is then
  0). `positions`: `vocabulary_positions` of the shortlist."""
  filler = tf.fill([tf.shape(logits)[0], 1], large_negative(tf.float32))
  return tf.gather(tf.concat([logits, filler], axis=1), positions, axis=1)
