"""The shortlist lexicon: Dice rankings and frequency priorities against hand-computed ones and
a plain-Python count, over blocks and over the training files as training reads them."""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline import lexical_shortlist, tfds_data
from data_pipeline.corpora import CorpusError
from data_pipeline.token_ids import EOS_ID
from tests import testutil
from tf_transformer.config import DataConfig

# (source ids, target ids) of four sentence pairs; a piece twice in a sentence counts once
PAIRS = [([4, 5], [6, 7]), ([4], [6]), ([5, 5], [7, 8, 7]), ([4, 9], [6, 8])]
# c(4) = 3, c(5) = 2, c(9) = 1; c(6) = 3, c(7) = 2, c(8) = 2; c(s, t): (4, 6) 3, (4, 7) 1,
# (4, 8) 1, (5, 6) 1, (5, 7) 2, (5, 8) 1, (9, 6) 1, (9, 8) 1. Dice 2 c(s, t) / (c(s) + c(t)):
# 4: 6 -> 1, 7 -> 0.4, 8 -> 0.4 (a tie: the lower id first); 5: 7 -> 1, 8 -> 0.5, 6 -> 0.4;
# 9: 8 -> 2/3, 6 -> 0.5, and no third
EXPECTED_TABLE = {4: [6, 7, 8], 5: [7, 8, 6], 9: [8, 6, EOS_ID]}
# by c(t): 6, 7, 8 (7 before 8: a tie), then the ids never seen, lowest first
FREQUENCY_ORDER = [6, 7, 8, 0, 1, 2, 3, 4, 5, 9]
VOCAB = 10


def ragged(rows):
  """Lists of ids -> RaggedIds (row_splits int64, ids int32)."""
  splits = np.cumsum([0] + [len(row) for row in rows]).astype(np.int64)
  return splits, np.array([i for row in rows for i in row], np.int32)


def block(pairs):
  return ragged([s for s, _ in pairs]), ragged([t for _, t in pairs])


def test_table_ranks_each_source_pieces_targets_by_dice():
  lexicon = lexical_shortlist.build([block(PAIRS)], VOCAB, VOCAB, per_source=3)
  assert lexicon.table.dtype == np.int32 and lexicon.table.shape == (VOCAB, 3)
  for source in range(VOCAB):
    assert list(lexicon.table[source]) == EXPECTED_TABLE.get(source, [EOS_ID] * 3), source
  shorter = lexical_shortlist.build([block(PAIRS)], VOCAB, VOCAB, per_source=2)
  assert [list(shorter.table[s]) for s in (4, 5, 9)] == [[6, 7], [7, 8], [8, 6]]


def test_order_ranks_target_pieces_by_frequency():
  order = lexical_shortlist.build([block(PAIRS)], VOCAB, VOCAB, per_source=3).order
  assert order.dtype == np.int32
  np.testing.assert_array_equal(order, FREQUENCY_ORDER)


def test_blocks_folded_one_at_a_time_count_as_one_block():
  whole = lexical_shortlist.build([block(PAIRS)], VOCAB, VOCAB, per_source=3)
  # a block per pair, each folded into the totals at once
  one_by_one = lexical_shortlist.build([block([pair]) for pair in PAIRS], VOCAB, VOCAB,
                                       per_source=3, merge_at=1)
  np.testing.assert_array_equal(one_by_one.table, whole.table)
  np.testing.assert_array_equal(one_by_one.order, whole.order)


def reference_table(id_pairs, source_size, per_source):
  """The table by plain-Python counting: source id -> its best target ids by Dice."""
  source_count, target_count, together = (collections.Counter() for _ in range(3))
  for source, target in id_pairs:
    source_count.update(set(source))
    target_count.update(set(target))
    together.update((s, t) for s in set(source) for t in set(target))
  table = np.full([source_size, per_source], EOS_ID)
  for s in source_count:
    ranked = sorted((t for (s2, t) in together if s2 == s), key=lambda t: (
        -2.0 * together[s, t] / (source_count[s] + target_count[t]), t))[:per_source]
    table[s, :len(ranked)] = ranked
  return table


@pytest.fixture
def corpus(tmp_path):
  """A training corpus in tmp_path (train.en/.de, a pair with an empty side among them) and its
  non-empty pairs."""
  pairs = testutil.sentence_pairs(60, seed=4, max_words=8)
  lines = pairs[:20] + [("", "ein leerer Satz")] + pairs[20:]
  testutil.write_pairs(tmp_path, "train", lines)
  return DataConfig(data_dir=str(tmp_path), src_lang="en", tgt_lang="de"), pairs


@pytest.mark.parametrize("limit", [lexical_shortlist.MAX_PAIRS, 25])
def test_from_training_data_counts_the_first_pairs_as_the_vocabulary_tokenizes_them(
    corpus, vocabulary, limit):
  config, pairs = corpus
  lexicon = lexical_shortlist.from_training_data(config, vocabulary, per_source=4, limit=limit)
  id_pairs = [tuple(side.tokenize(tf.constant([text])).flat_values.numpy().tolist()
                    for side, text in ((vocabulary.source, s), (vocabulary.target, t)))
              for s, t in pairs[:limit]]
  expected = reference_table(id_pairs, vocabulary.source_size, 4)
  np.testing.assert_array_equal(lexicon.table, expected)
  counts = collections.Counter(t for _, target in id_pairs for t in set(target))
  assert [counts[t] for t in lexicon.order] == sorted(counts[t] for t in lexicon.order)[::-1]


def test_missing_training_file_is_a_one_line_corpus_error(tmp_path, vocabulary):
  config = DataConfig(data_dir=str(tmp_path), src_lang="en", tgt_lang="de")
  with pytest.raises(CorpusError, match=f"^{tmp_path}/train.en: no such file"):
    lexical_shortlist.from_training_data(config, vocabulary, per_source=4)


def test_a_tfds_task_counts_its_train_split_with_the_model_directorys_vocabulary(
    corpus, vocabulary, tmp_path):
  files_config, _ = corpus
  paths = tuple(str(tmp_path / f"train.{lang}") for lang in ("en", "de"))
  tfds_data.build_dataset({"train": paths}, "shortlist_corpus", str(tmp_path / "tfds"), "en",
                          "de")
  folder = os.path.dirname(vocabulary.source_model_path)
  before = sorted(os.listdir(folder))
  # flags that name separate vocabularies: the model directory's joint one is used all the same
  config = DataConfig(dataset="tfds:shortlist_corpus", tfds_data_dir=str(tmp_path / "tfds"),
                      src_lang="en", tgt_lang="de", shared_vocab=False)
  from_tfds = lexical_shortlist.from_training_data(config, vocabulary, per_source=4)
  from_files = lexical_shortlist.from_training_data(files_config, vocabulary, per_source=4)
  np.testing.assert_array_equal(from_tfds.table, from_files.table)  # whatever the pairs' order
  np.testing.assert_array_equal(from_tfds.order, from_files.order)
  assert sorted(os.listdir(folder)) == before  # no subword model trained
