"""In-graph shortlists: each sentence's tiers worked by hand on a tiny lexicon, a static size
under XLA, and logits spread back over the vocabulary."""

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline.lexical_shortlist import frequency_order
from data_pipeline.token_ids import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.decoding import shortlist

TARGET_VOCAB = 12


def lexicon():
  """A table of 2 candidates per source id (8 of them) and the frequency order of target
  counts."""
  table = np.full([8, 2], EOS_ID, np.int32)
  table[PAD_ID] = [11, 11]  # a trap: padding brings no candidate
  table[4], table[5], table[6] = [9, 10], [10, 6], [7, EOS_ID]
  # by frequency: 4, 5, 6, 7, 8, 9, 10, 11, then the never seen 0, 1, 2, 3
  counts = np.array([0, 0, 0, 0, 50, 40, 30, 20, 10, 5, 2, 1])
  return tf.constant(table), tf.constant(frequency_order(counts))


SOURCES = tf.constant([[4, 5, EOS_ID, PAD_ID], [4, EOS_ID, PAD_ID, PAD_ID]])


@pytest.mark.parametrize("size, expected", [
    # EOS; the lexical candidates (6, 9, 10 of 4 and 5; 9, 10 of 4), most frequent first; then
    # by frequency
    (6, [[EOS_ID, 6, 9, 10, 4, 5], [EOS_ID, 9, 10, 4, 5, 6]]),
    # room for one beside EOS: each source piece's best candidate (9 of 4, 10 of 5), the more
    # frequent first
    (2, [[EOS_ID, 9], [EOS_ID, 9]]),
    # the whole vocabulary: PAD and BOS last, UNK (1) before them
    (TARGET_VOCAB, [[EOS_ID, 6, 9, 10, 4, 5, 7, 8, 11, 1, PAD_ID, BOS_ID],
                    [EOS_ID, 9, 10, 4, 5, 6, 7, 8, 11, 1, PAD_ID, BOS_ID]]),
])
def test_eos_then_lexical_candidates_then_frequent_pieces(size, expected):
  table, order = lexicon()
  ids = shortlist.select(table, order, SOURCES, size)
  assert ids.dtype == tf.int32
  assert ids.numpy().tolist() == expected


def test_each_source_pieces_best_candidates_go_in_before_any_pieces_next():
  """4 5 6 has four candidates: the best of each piece (9 of 4, 10 of 5, 7 of 6) and 5's second,
  6. With room for three beside EOS, each piece keeps its best; by frequency alone, 6 would
  have pushed out 10. With room for four, every candidate is in."""
  table, order = lexicon()
  sentence = tf.constant([[4, 5, 6]])
  assert shortlist.select(table, order, sentence, 4).numpy().tolist() == [[EOS_ID, 7, 9, 10]]
  assert shortlist.select(table, order, sentence, 5).numpy().tolist() == [[EOS_ID, 6, 7, 9, 10]]
  # forced pieces take room first: one forced piece leaves room for the best ones only
  forced = tf.constant([[8]])
  assert shortlist.select(table, order, sentence, 5, forced_ids=forced).numpy().tolist() == [
      [EOS_ID, 8, 7, 9, 10]]


def test_a_sentences_shortlist_does_not_depend_on_its_batch():
  table, order = lexicon()
  together = shortlist.select(table, order, SOURCES, 6).numpy()
  for row in range(2):
    alone = shortlist.select(table, order, SOURCES[row:row + 1], 6).numpy()
    np.testing.assert_array_equal(alone[0], together[row])


def test_forced_pieces_come_before_lexical_candidates():
  table, order = lexicon()
  forced = tf.constant([[8, PAD_ID], [11, 8]])
  ids = shortlist.select(table, order, SOURCES, 6, forced_ids=forced)
  assert ids.numpy().tolist() == [[EOS_ID, 8, 6, 9, 10, 4], [EOS_ID, 8, 11, 9, 10, 4]]


def test_static_size_under_xla():
  table, order = lexicon()
  select = tf.function(lambda ids: shortlist.select(table, order, ids, 6), jit_compile=True,
                       input_signature=[tf.TensorSpec([None, None], tf.int32)])
  concrete = select.get_concrete_function()
  assert concrete.structured_outputs.shape.as_list() == [None, 6]
  assert select(SOURCES).numpy().tolist() == [[EOS_ID, 6, 9, 10, 4, 5],
                                              [EOS_ID, 9, 10, 4, 5, 6]]
  # one sentence of one piece, and sentences whose lexicon candidates all collide with EOS
  assert select(tf.constant([[6]])).numpy().tolist() == [[EOS_ID, 7, 4, 5, 6, 8]]
  assert select(tf.constant([[7, 7], [3, 0]])).numpy().tolist() == [[EOS_ID, 4, 5, 6, 7, 8]] * 2


def test_spread_puts_each_logit_at_its_id_and_a_large_negative_elsewhere():
  """Two sentences of two rows each, each sentence over its own shortlist."""
  ids = tf.constant([[EOS_ID, 7, 5], [4, 8, EOS_ID]])
  logits = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.5, 2.5, 3.5]])
  spread = shortlist.spread(logits, shortlist.vocabulary_positions(ids, 9)).numpy()
  assert spread.shape == (4, 9)
  for rows, listed in (([0, 1], [EOS_ID, 7, 5]), ([2, 3], [4, 8, EOS_ID])):
    np.testing.assert_array_equal(spread[rows][:, listed], logits.numpy()[rows])
    others = [i for i in range(9) if i not in listed]
    assert (spread[rows][:, others] <= -1e9).all()
    # its softmax is the softmax over the shortlist
    np.testing.assert_allclose(tf.nn.softmax(spread[rows]).numpy()[:, listed],
                               tf.nn.softmax(logits[rows[0]:rows[-1] + 1]).numpy(), rtol=1e-6)
