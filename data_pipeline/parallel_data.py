"""A translation task's data: validated corpora, its subword vocabulary and its pipelines."""

from absl import logging

from data_pipeline import corpora, pipeline, tokenizer


class ParallelData:
  """The train/dev/test corpora of one direction under `data_dir`, ready for training.

  Construction validates the training and dev corpora (line counts, UTF-8, empty files), and
  trains the SentencePiece model(s) into `model_dir` the first time (reused after).
  """

  def __init__(self, config, model_dir: str):
    """Args: config: a DataConfig; model_dir: where the subword models live."""
    self.config = config
    c = config
    self.train_paths = self._find(c.train_prefix)
    self.train_scan = self._scan("train", self.train_paths)
    self.dev_paths = self._find(c.dev_prefix) if c.dev_prefix else None
    self.dev_scan = self._scan("dev", self.dev_paths) if self.dev_paths else None
    self.test_paths = self._find(c.test_prefix) if c.test_prefix else None
    scan = self.train_scan
    if scan.num_lines - scan.empty_pairs - len(scan.bad_lines) <= 0:
      self._nothing_left()  # before SentencePiece, which cannot train on nothing
    self.vocabulary = self._build_vocabulary(model_dir)
    kept, too_long = pipeline.count_examples(self.train_pairs(), self.vocabulary, c.max_length)
    logging.info("train: %d pairs kept, %d dropped over --max_length=%d subword tokens",
                 kept, too_long, c.max_length)
    if kept == 0:
      self._nothing_left()

  def _nothing_left(self):
    raise corpora.CorpusError(f"{self.train_paths[0]}: no pair left for training (all empty, "
                              f"invalid or over --max_length={self.config.max_length})")

  def _find(self, prefix):
    c = self.config
    return (corpora.find_corpus_file(c.data_dir, prefix, c.src_lang),
            corpora.find_corpus_file(c.data_dir, prefix, c.tgt_lang))

  def _scan(self, name, paths):
    scan = corpora.scan_parallel(*paths, on_bad_line=self.config.on_bad_line)
    logging.info("%s: %d lines in %s; %d empty pairs dropped; %d non-UTF-8 pairs skipped",
                 name, scan.num_lines, " / ".join(paths), scan.empty_pairs, len(scan.bad_lines))
    return scan

  def _build_vocabulary(self, model_dir):
    paths = {"both": self.train_paths, "source": self.train_paths[:1],
             "target": self.train_paths[1:]}
    return tokenizer.ensure_vocabulary(
        model_dir, self.config,
        lambda side: corpora.iterate_sentences(paths[side], self.train_scan.bad_lines))

  def train_pairs(self):
    """tf.data of the training (source, target) strings."""
    return pipeline.text_pairs(*self.train_paths, skip_lines=self.train_scan.bad_lines)

  def train_batches(self, seed: int, num_shards: int = 1, shard: int = 0):
    """Endless training batches of this worker's shard (every num_shards-th pair)."""
    c = self.config
    pairs = self.train_pairs()
    if num_shards > 1:
      pairs = pairs.shard(num_shards, shard)
    # a buffer over the corpus's size shuffles alike, but every checkpoint of the iterator
    # writes each of its empty slots (26 MB and a second per save for the default 100,000)
    buffer = min(c.shuffle_buffer, self.train_scan.num_lines)
    return pipeline.train_batches(pairs, self.vocabulary, c.max_length, c.batch_tokens, buffer,
                                  seed)

  def dev_batches(self):
    """One pass over the dev set in bucketed batches (for the dev loss), or None."""
    if not self.dev_paths:
      return None
    pairs = pipeline.text_pairs(*self.dev_paths, skip_lines=self.dev_scan.bad_lines)
    return pipeline.eval_batches(pairs, self.vocabulary, self.config.max_length,
                                 self.config.batch_tokens)

  def dev_pairs(self, limit: int = 0):
    """The first `limit` (0: all) dev pairs as Python strings (for BLEU)."""
    if not self.dev_paths:
      return []
    return corpora.read_parallel(*self.dev_paths, limit=limit, skip_lines=self.dev_scan.bad_lines)

  def test_pairs(self):
    """Every test pair as Python strings, or [] without --test_prefix."""
    if not self.test_paths:
      return []
    scan = corpora.scan_parallel(*self.test_paths, on_bad_line=self.config.on_bad_line)
    return corpora.read_parallel(*self.test_paths, skip_lines=scan.bad_lines)


def open_data(config, model_dir: str):
  """The task data `config` names: TFDS (--dataset=tfds:NAME) or text files (--data_dir)."""
  if config.dataset:
    from data_pipeline.tfds_data import TfdsData
    return TfdsData(config, model_dir)
  return ParallelData(config, model_dir)
