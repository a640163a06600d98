"""A lexicon for vocabulary shortlists: the target pieces that go with each source piece, counted
over the training pairs (the vocabulary map of CTranslate2, Marian's lexical shortlists).

For a source piece s and a target piece t, c(s, t) is the number of sentence pairs in which
both occur, c(s) and c(t) the number in which each occurs (a piece counts once per sentence).
A pair is scored by the Dice coefficient 2 c(s, t) / (c(s) + c(t)), and each source piece keeps
its `per_source` best target pieces. An export's search writes only the pieces that its
sources' lists name, the end of sentence and the most frequent target pieces
(tf_transformer/decoding/shortlist.py).

The counting is numpy over int64 keys s * V + t, a block of pairs at a time; only the first
MAX_PAIRS pairs of the training data are read, which bounds its time and memory.
"""

import dataclasses
import os
from typing import Iterable, Iterator

import numpy as np
import tensorflow as tf
from absl import logging

from data_pipeline import corpora, language_tags, pipeline
from data_pipeline.token_ids import EOS_ID

MAX_PAIRS = 500_000
_BLOCK = 4096  # sentence pairs tokenized and counted at a time
_MERGE_AT = 1 << 22  # the blocks' (s, t) counts are folded into the totals past this many

# a block of sentences as numpy: (row_splits int64 [n + 1], ids int [total]), the ids of
# sentence i being ids[row_splits[i]:row_splits[i + 1]] (a tf.RaggedTensor's layout)
RaggedIds = tuple[np.ndarray, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Lexicon:
  """What a shortlist is chosen from.

  Attributes:
    table: int32 [source_vocab_size, per_source]: each source id's target ids by Dice, best
      first (ties: the lower id first), EOS_ID-padded where fewer target ids co-occur with it.
    order: int32 [target_vocab_size]: the target ids ranked by c(t), the most frequent first
      (ties: the lower id first).
  """
  table: np.ndarray
  order: np.ndarray


def _distinct_per_row(ragged: RaggedIds, vocab_size: int):
  """The distinct ids of each row: (rows int64 [m], ids int64 [m]), by row then id."""
  splits, ids = ragged
  rows = np.repeat(np.arange(len(splits) - 1, dtype=np.int64), np.diff(splits))
  keys = np.unique(rows * vocab_size + ids.astype(np.int64))
  return keys // vocab_size, keys % vocab_size


class CooccurrenceCounts:
  """c(s, t), c(s) and c(t) over blocks of sentence pairs.

  Attributes:
    source: int64 [source_vocab_size], c(s).
    target: int64 [target_vocab_size], c(t).
  """

  def __init__(self, source_vocab_size: int, target_vocab_size: int, merge_at: int = _MERGE_AT):
    self.source_vocab_size, self.target_vocab_size = source_vocab_size, target_vocab_size
    self.source = np.zeros(source_vocab_size, np.int64)
    self.target = np.zeros(target_vocab_size, np.int64)
    self._keys = np.zeros(0, np.int64)  # s * target_vocab_size + t, sorted
    self._counts = np.zeros(0, np.int64)
    self._pending = []  # the blocks' (keys, counts) not yet folded in
    self._pending_size = 0
    self._merge_at = merge_at

  def add(self, source: RaggedIds, target: RaggedIds):
    """Counts a block: the source and target sentences of the same n pairs."""
    source_rows, source_ids = _distinct_per_row(source, self.source_vocab_size)
    target_rows, target_ids = _distinct_per_row(target, self.target_vocab_size)
    self.source += np.bincount(source_ids, minlength=self.source_vocab_size)
    self.target += np.bincount(target_ids, minlength=self.target_vocab_size)
    # each source id of a pair, repeated once for every target id of that pair
    per_pair = np.bincount(target_rows, minlength=len(source[0]) - 1)  # -> [n]
    first = np.cumsum(per_pair) - per_pair  # each pair's first position in target_ids
    repeats = per_pair[source_rows]  # -> [m_source]
    within = np.arange(repeats.sum()) - np.repeat(np.cumsum(repeats) - repeats, repeats)
    targets = target_ids[np.repeat(first[source_rows], repeats) + within]
    keys, counts = np.unique(np.repeat(source_ids, repeats) * self.target_vocab_size + targets,
                             return_counts=True)
    self._pending.append((keys, counts))
    self._pending_size += len(keys)
    if self._pending_size >= self._merge_at:
      self._merge()

  def _merge(self):
    keys = np.concatenate([self._keys] + [keys for keys, _ in self._pending])
    counts = np.concatenate([self._counts] + [counts for _, counts in self._pending])
    self._keys, inverse = np.unique(keys, return_inverse=True)
    self._counts = np.bincount(inverse.reshape(-1), weights=counts).astype(np.int64)
    self._pending, self._pending_size = [], 0

  def pairs(self):
    """(source ids int64 [P], target ids int64 [P], c(s, t) int64 [P]) of every pair that
    co-occurs, by source id then target id."""
    self._merge()
    return (self._keys // self.target_vocab_size, self._keys % self.target_vocab_size,
            self._counts)


def frequency_order(target_counts: np.ndarray) -> np.ndarray:
  """int32 [V]: the ids of `target_counts` (int [V]) ranked by count, the most frequent first
  (ties: the lower id first)."""
  size = len(target_counts)
  return np.lexsort((np.arange(size), -np.asarray(target_counts))).astype(np.int32)


def build(blocks: Iterable[tuple[RaggedIds, RaggedIds]], source_vocab_size: int,
          target_vocab_size: int, per_source: int, merge_at: int = _MERGE_AT) -> Lexicon:
  """The Lexicon of sentence pairs given as blocks of (source, target) RaggedIds.

  Args:
    blocks: each block the source and target ids of the same pairs.
    source_vocab_size, target_vocab_size: every id is below its side's size.
    per_source: k, the target ids kept per source id.
    merge_at: see CooccurrenceCounts (tests lower it to fold in every block).
  """
  counts = CooccurrenceCounts(source_vocab_size, target_vocab_size, merge_at)
  for source, target in blocks:
    counts.add(source, target)
  sources, targets, together = counts.pairs()
  dice = 2.0 * together / (counts.source[sources] + counts.target[targets])
  order = np.lexsort((targets, -dice, sources))  # by source, Dice descending, then target id
  sources, targets = sources[order], targets[order]
  rank = np.arange(len(sources)) - np.searchsorted(sources, sources)  # within its source
  kept = rank < per_source
  table = np.full([source_vocab_size, per_source], EOS_ID, np.int32)
  table[sources[kept], rank[kept]] = targets[kept]
  return Lexicon(table, frequency_order(counts.target))


def training_pairs(config, vocabulary) -> tf.data.Dataset:
  """The training data of DataConfig `config` as training reads it: tf.data of (source,
  target) strings, stripped, empty pairs left out.

  `vocabulary` is the model directory's (tokenizer.Vocabulary): a TFDS task's reader
  (data_pipeline.tfds_data) wants the model directory of its subword models, found there.

  Raises:
    CorpusError: a training file (or the TFDS dataset) is missing, in one line naming it.
  """
  if config.dataset:
    from data_pipeline.tfds_data import TfdsData  # TFDS loads for a TFDS task only

    # the model directory's subword models as they are: nothing is trained
    shared = vocabulary.source_model_path == vocabulary.target_model_path
    config = dataclasses.replace(config, shared_vocab=shared)
    return TfdsData(config, os.path.dirname(vocabulary.source_model_path)).train_pairs()
  pairs = []
  for lang in config.tgt_langs:
    for prefix in config.train_prefixes:
      text = pipeline.text_pairs(corpora.find_corpus_file(config.data_dir, prefix,
                                                          config.src_lang),
                                 corpora.find_corpus_file(config.data_dir, prefix, lang))
      # a multilingual model's sources as it reads them, its target-language token first
      pairs.append(language_tags.tag_sources(text, lang) if len(config.tgt_langs) > 1
                   else text)
  return pipeline.concatenated(pairs)


def token_blocks(pairs: tf.data.Dataset, vocabulary,
                 limit: int = MAX_PAIRS) -> Iterator[tuple[RaggedIds, RaggedIds]]:
  """The first `limit` (source, target) string pairs of `pairs` as subword ids of
  `vocabulary` (no EOS), in blocks of at most _BLOCK pairs."""
  def tokenize(source, target):
    source_ids = vocabulary.source.tokenize(source)  # -> ragged [n, None]
    target_ids = vocabulary.target.tokenize(target)
    return (source_ids.row_splits, source_ids.flat_values, target_ids.row_splits,
            target_ids.flat_values)

  blocks = pairs.take(limit).batch(_BLOCK).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
  for source_splits, source_ids, target_splits, target_ids in blocks.as_numpy_iterator():
    yield (source_splits, source_ids), (target_splits, target_ids)


def from_training_data(config, vocabulary, per_source: int, limit: int = MAX_PAIRS) -> Lexicon:
  """The Lexicon of the first `limit` training pairs of DataConfig `config`, in the pieces of
  the model directory's `vocabulary` (tokenizer.Vocabulary).

  Raises:
    CorpusError: the training data is missing (see `training_pairs`).
  """
  pairs_read = [0]

  def counted(blocks):
    for source, target in blocks:
      pairs_read[0] += len(source[0]) - 1
      yield source, target

  blocks = token_blocks(training_pairs(config, vocabulary), vocabulary, limit)
  lexicon = build(counted(blocks), vocabulary.source_size, vocabulary.target_size, per_source)
  logging.info("shortlist lexicon: %d target pieces for each of %d source pieces, from %d "
               "training pairs", per_source, vocabulary.source_size, pairs_read[0])
  return lexicon
