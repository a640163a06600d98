"""A translation task's data: validated corpora, its subword vocabulary and its pipelines."""

from absl import logging

from data_pipeline import corpora, pipeline, tokenizer


class ParallelData:
  """The train/dev/test corpora of one direction under `data_dir`, ready for training.

  Construction validates the training and dev corpora (line counts, UTF-8, empty files), and
  trains the SentencePiece model(s) into `model_dir` the first time (reused after), on the
  sentences of every training corpus.
  """

  def __init__(self, config, model_dir: str):
    """Args: config: a DataConfig; model_dir: where the subword models live."""
    self.config = config
    c = config
    # (source path, target path, scan) of each training corpus, in --train_prefix's order
    self.train_corpora = []
    for prefix in c.train_prefixes:
      paths = self._find(prefix)
      self.train_corpora.append((*paths, self._scan("train", paths)))
    self.dev_paths = self._find(c.dev_prefix) if c.dev_prefix else None
    self.dev_scan = self._scan("dev", self.dev_paths) if self.dev_paths else None
    self.test_paths = self._find(c.test_prefix) if c.test_prefix else None
    self.train_weights = self._weights()
    if sum(self._usable_lines(scan) for *_, scan in self.train_corpora) <= 0:
      self._nothing_left()  # before SentencePiece, which cannot train on nothing
    self.vocabulary = self._build_vocabulary(model_dir)
    kept, too_long = pipeline.count_examples(self.train_pairs(), self.vocabulary, c.max_length)
    logging.info("train: %d pairs kept, %d dropped over --max_length=%d subword tokens",
                 kept, too_long, c.max_length)
    if kept == 0:
      self._nothing_left()

  @staticmethod
  def _usable_lines(scan):
    return scan.num_lines - scan.empty_pairs - len(scan.bad_lines)

  def _weights(self):
    """Each training corpus's share of the pairs drawn: --train_weights, or the corpora's
    usable pairs (concatenation's shares)."""
    if len(self.train_corpora) == 1:
      return (1.0,)
    weights = self.config.train_weights or tuple(
        float(self._usable_lines(scan)) for *_, scan in self.train_corpora)
    for (source, _, scan), weight in zip(self.train_corpora, weights):
      if weight > 0 and self._usable_lines(scan) <= 0:
        raise corpora.CorpusError(f"{source}: no usable pair, but its --train_weights is "
                                  f"{weight:g}")
    total = sum(weights)
    logging.info("train: corpora drawn from by shares %s", ", ".join(
        f"{source} {weight / total:.3f}" for (source, _, _), weight in zip(self.train_corpora,
                                                                           weights)))
    return tuple(weight / total for weight in weights)

  def _nothing_left(self):
    raise corpora.CorpusError(f"{self.train_corpora[0][0]}: no pair left for training (all "
                              f"empty, invalid or over --max_length={self.config.max_length})")

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
    sides = {"both": (0, 1), "source": (0,), "target": (1,)}

    def sentences(side):
      for corpus in self.train_corpora:
        yield from corpora.iterate_sentences([corpus[index] for index in sides[side]],
                                             corpus[2].bad_lines)

    return tokenizer.ensure_vocabulary(model_dir, self.config, sentences)

  def _corpus_pairs(self, corpus):
    source, target, scan = corpus
    return pipeline.text_pairs(source, target, skip_lines=scan.bad_lines)

  def train_pairs(self):
    """tf.data of the training (source, target) strings, every corpus once, in order."""
    pairs = [self._corpus_pairs(corpus) for corpus in self.train_corpora]
    return pipeline.concatenated(pairs)

  def train_batches(self, seed: int, num_shards: int = 1, shard: int = 0):
    """Endless training batches of this worker's shard (every num_shards-th pair of each
    corpus), the corpora drawn from by their weights."""
    c = self.config
    streams = []
    for corpus in self.train_corpora:
      pairs = self._corpus_pairs(corpus)
      if num_shards > 1:
        pairs = pairs.shard(num_shards, shard)
      # a buffer over the corpus's size shuffles alike, but every checkpoint of the iterator
      # writes each of its empty slots (26 MB and a second per save for the default 100,000)
      streams.append((pairs, min(c.shuffle_buffer, corpus[2].num_lines)))
    return pipeline.train_batches(streams, self.vocabulary, c.max_length, c.batch_tokens, seed,
                                  self.train_weights, c.subword_alpha, c.subword_nbest_size)

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
