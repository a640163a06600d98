"""tf.data pipelines: corpus lines -> subword ids -> bucketed batches for training and eval."""

import functools

import tensorflow as tf

from data_pipeline import bucketing
from data_pipeline.token_ids import EOS_ID, PAD_ID, UNK_ID, decoder_inputs
from data_pipeline.tokenizer import Vocabulary

AUTOTUNE = tf.data.AUTOTUNE
_TOKENIZE_BATCH = 256  # tf-text tokenizes a batch of lines per op call much faster than one
_LINE_BLOCK = 1024  # lines stripped and filtered per call


# ---------------------------------------------------------------- raw text


def text_pairs(source_path: str, target_path: str, skip_lines=()) -> tf.data.Dataset:
  """(source line, target line) string pairs of two line-aligned files, stripped, without
  empty pairs.

  Args:
    skip_lines: 0-based numbers of the pairs to leave out (e.g. non-UTF-8 lines).
  """
  def lines(path):
    compression = "GZIP" if path.endswith(".gz") else ""
    return tf.data.TextLineDataset(path, compression_type=compression)

  dataset = tf.data.Dataset.zip(lines(source_path), lines(target_path))
  if skip_lines:
    skip = tf.constant(sorted(skip_lines), tf.int64)
    dataset = dataset.enumerate().filter(
        lambda i, pair: tf.reduce_all(tf.not_equal(skip, i))).map(lambda i, pair: pair)
  return drop_empty_pairs(dataset)


def concatenated(datasets: list[tf.data.Dataset]) -> tf.data.Dataset:
  """The elements of `datasets` (at least one, of one element spec), one dataset after the
  other."""
  return functools.reduce(lambda first, second: first.concatenate(second), datasets)


def drop_empty_pairs(pairs: tf.data.Dataset) -> tf.data.Dataset:
  """Strips (source, target) string pairs and drops those with an empty side.

  Works on blocks of lines: a function call per line would cost more than the work itself.
  """
  def strip_block(source, target):
    source, target = tf.strings.strip(source), tf.strings.strip(target)
    keep = tf.logical_and(tf.strings.length(source) > 0, tf.strings.length(target) > 0)
    return tf.boolean_mask(source, keep), tf.boolean_mask(target, keep)

  return pairs.batch(_LINE_BLOCK).map(strip_block, num_parallel_calls=AUTOTUNE).unbatch()


# ---------------------------------------------------------------- tokenization


def _tokenize_block(vocabulary: Vocabulary, max_length: int, source, target):
  """A block of n string pairs -> (source_ids, target_ids) ragged int32 [n, None] and `fits`
  bool [n]: whether neither side is over `max_length` subword tokens."""
  source_ids = vocabulary.source.tokenize(source)
  target_ids = vocabulary.target.tokenize(target)
  fits = tf.logical_and(source_ids.row_lengths() <= max_length,
                        target_ids.row_lengths() <= max_length)
  return source_ids, target_ids, fits


def tokenize_pairs(vocabulary: Vocabulary, max_length: int):
  """Dataset of string pairs -> (source_ids [W], target_ids [W], length []) int32, with
  W = max_length + 1.

  Each side gets EOS appended and PAD_ID up to W; `length` is the longer side with its EOS.
  Pairs with a side over `max_length` subword tokens (before EOS) are dropped. Tokenizing,
  dropping and padding work on blocks of pairs, and the rows keep one width so that unbatching
  them costs no per-pair function call (bucketing cuts each batch to its bucket's length).
  """
  eos = tf.constant([[EOS_ID]], tf.int32)
  width = max_length + 1

  def tokenize_block(source, target):
    source_ids, target_ids, fits = _tokenize_block(vocabulary, max_length, source, target)
    source_ids = tf.ragged.boolean_mask(source_ids, fits)
    target_ids = tf.ragged.boolean_mask(target_ids, fits)
    rows = tf.shape(source_ids.row_lengths())
    eos_column = tf.RaggedTensor.from_tensor(tf.tile(eos, tf.concat([rows, [1]], 0)))
    source_ids = tf.concat([source_ids, eos_column], axis=1)
    target_ids = tf.concat([target_ids, eos_column], axis=1)
    length = tf.cast(tf.maximum(source_ids.row_lengths(), target_ids.row_lengths()), tf.int32)
    return (source_ids.to_tensor(PAD_ID, shape=[None, width]),
            target_ids.to_tensor(PAD_ID, shape=[None, width]), length)

  def apply(dataset):
    return (dataset.batch(_TOKENIZE_BATCH)
            .map(tokenize_block, num_parallel_calls=AUTOTUNE)
            .unbatch())

  return apply


# ---------------------------------------------------------------- batches


def add_decoder_inputs(source_ids, target_ids):
  """(source [B, L], target [B, L]) -> (source, target_input, target); see
  token_ids.decoder_inputs."""
  return source_ids, decoder_inputs(target_ids), target_ids


def drop_source_tokens(rate: float, seed: int, kept_prefix: int = 0):
  """Source token dropout: each source piece of a batch becomes UNK_ID with probability `rate`,
  drawn anew for each batch (a word-dropout variant, as Marian's --dropout-src, on subword
  pieces). EOS, padding and the first `kept_prefix` pieces of each row (a multilingual model's
  target-language token) are kept; targets are unchanged.

  The draws are stateless, seeded by tf.data's own random stream, so that a checkpointed
  iterator resumes them where it stopped.

  Returns:
    A function Dataset -> Dataset of (source_ids [batch, L], target_ids [batch, L]) int32.
  """
  def drop(seeds, source_ids, target_ids):
    kept = tf.random.stateless_uniform(tf.shape(source_ids), seed=seeds) >= rate
    protected = ((source_ids == EOS_ID) | (source_ids == PAD_ID)
                 | (tf.range(tf.shape(source_ids)[1]) < kept_prefix)[tf.newaxis, :])
    return tf.where(kept | protected, source_ids, UNK_ID), target_ids

  def apply(dataset):
    seeds = tf.data.Dataset.random(seed=seed).batch(2)
    return tf.data.Dataset.zip(seeds, dataset).map(
        lambda seeds, batch: drop(seeds, *batch), num_parallel_calls=AUTOTUNE)

  return apply


def train_batches(corpora: list[tuple[tf.data.Dataset, int]], vocabulary: Vocabulary,
                  max_length: int, batch_tokens: int, seed: int, weights=None,
                  subword_alpha: float = 0.0, subword_nbest_size: int = -1,
                  subword_sides: str = "both", source_token_dropout: float = 0.0,
                  kept_source_prefix: int = 0) -> tf.data.Dataset:
  """Endless shuffled, bucketed training batches of one or more corpora.

  Args:
    corpora: (string pairs, shuffle buffer) of each training corpus. Each is shuffled and
      repeated on its own (corpus i with seed + i).
    seed: the shuffles' and the mixture's seed.
    weights: with several corpora, each one's share of the pairs drawn (normalised; drawn
      before pairs over max_length are dropped), as tf.data's sample_from_datasets draws.
    subword_alpha, subword_nbest_size, subword_sides: alpha > 0, each pair is segmented anew
      each time it is read, on those sides (Vocabulary.sampling); 0, by the one best
      segmentation.
    source_token_dropout, kept_source_prefix: rate > 0, drop_source_tokens after batching.

  Returns:
    Dataset of (source_ids, target_input_ids, target_ids), each int32 [batch, L].
  """
  streams = [pairs.shuffle(buffer, seed=seed + index, reshuffle_each_iteration=True).repeat()
             for index, (pairs, buffer) in enumerate(corpora)]
  mixed = streams[0] if len(streams) == 1 else tf.data.Dataset.sample_from_datasets(
      streams, weights=[float(weight) for weight in weights], seed=seed)
  if subword_alpha > 0:
    vocabulary = vocabulary.sampling(subword_alpha, subword_nbest_size, subword_sides)
  batches = (mixed
             .apply(tokenize_pairs(vocabulary, max_length))
             .apply(bucketing.bucket_by_length(max_length + 1, batch_tokens)))
  if source_token_dropout > 0:
    batches = batches.apply(drop_source_tokens(source_token_dropout, seed, kept_source_prefix))
  return batches.map(add_decoder_inputs, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)


def eval_batches(pairs: tf.data.Dataset, vocabulary: Vocabulary, max_length: int,
                 batch_tokens: int) -> tf.data.Dataset:
  """One pass of bucketed batches in a fixed order (dev loss)."""
  return (pairs
          .apply(tokenize_pairs(vocabulary, max_length))
          .apply(bucketing.bucket_by_length(max_length + 1, batch_tokens))
          .map(add_decoder_inputs, num_parallel_calls=AUTOTUNE)
          .prefetch(AUTOTUNE))


def count_examples(pairs: tf.data.Dataset, vocabulary: Vocabulary, max_length: int):
  """(pairs kept, pairs over max_length) in one tokenizing pass over `pairs`, counted a block
  of pairs at a time (no per-pair element: the pass is over the whole training corpus)."""
  def count_block(source, target):
    fits = _tokenize_block(vocabulary, max_length, source, target)[2]
    return tf.stack([tf.reduce_sum(tf.cast(fits, tf.int64)), tf.size(fits, tf.int64)])

  kept, total = (pairs.batch(_TOKENIZE_BATCH)
                 .map(count_block, num_parallel_calls=AUTOTUNE)
                 .reduce(tf.zeros([2], tf.int64), lambda sums, block: sums + block)).numpy()
  return int(kept), int(total - kept)
