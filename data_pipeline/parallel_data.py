"""A translation task's data: validated corpora, its subword vocabulary and its pipelines."""

from typing import NamedTuple

from absl import logging

from data_pipeline import corpora, language_tags, pipeline, tokenizer


class Corpus(NamedTuple):
  """One training corpus: `source` and `target` paths, their `scan` (corpora.CorpusScan) and the
  target language."""
  source: str
  target: str
  scan: corpora.CorpusScan
  lang: str


class ParallelData:
  """The train/dev/test corpora under `data_dir` of one direction, or of one source language
  into several target languages (a multilingual model: each source carries its target
  language's token, language_tags.py), ready for training.

  Construction validates the training and dev corpora (line counts, UTF-8, empty files), and
  trains the SentencePiece model(s) into `model_dir` the first time (reused after), on the
  sentences of every training corpus.
  """

  def __init__(self, config, model_dir: str):
    """Args: config: a DataConfig; model_dir: where the subword models live."""
    self.config = config
    c = config
    self.multilingual = len(c.tgt_langs) > 1
    # each target language's training corpora, in train_prefix's order
    self.train_corpora = []
    for lang in c.tgt_langs:
      for prefix in c.train_prefixes:
        paths = self._find(prefix, lang)
        self.train_corpora.append(Corpus(*paths, self._scan("train", paths), lang))
    # (source path, target path, scan) of each target language's dev set
    self.dev_sets = {}
    if c.dev_prefix:
      for lang in c.tgt_langs:
        paths = self._find(c.dev_prefix, lang)
        self.dev_sets[lang] = (*paths, self._scan("dev", paths))
    self.test_paths = ({lang: self._find(c.test_prefix, lang) for lang in c.tgt_langs}
                       if c.test_prefix else {})
    self.train_weights = self._weights()
    if sum(self._usable_lines(corpus.scan) for corpus in self.train_corpora) <= 0:
      self._nothing_left()  # before SentencePiece, which cannot train on nothing
    self.vocabulary = self._build_vocabulary(model_dir)
    kept, too_long = pipeline.count_examples(self.train_pairs(), self.vocabulary, c.max_length)
    logging.info("train: %d pairs kept, %d dropped over max_length=%d subword tokens",
                 kept, too_long, c.max_length)
    if kept == 0:
      self._nothing_left()

  @staticmethod
  def _usable_lines(scan):
    return scan.num_lines - scan.empty_pairs - len(scan.bad_lines)

  def _weights(self):
    """Each training corpus's share of the pairs drawn: train_weights, or the corpora's
    usable pairs (concatenation's shares)."""
    if len(self.train_corpora) == 1:
      return (1.0,)
    weights = self.config.train_weights or tuple(
        float(self._usable_lines(corpus.scan)) for corpus in self.train_corpora)
    for corpus, weight in zip(self.train_corpora, weights):
      if weight > 0 and self._usable_lines(corpus.scan) <= 0:
        # a multilingual task's source files are each language's: its target names the corpus
        name = corpus.target if self.multilingual else corpus.source
        raise corpora.CorpusError(f"{name}: no usable pair, but its {{train_weights:name}} is "
                                  f"{weight:g}", train_weights=None)
    total = sum(weights)
    logging.info("train: corpora drawn from by shares %s", ", ".join(
        f"{corpus.target} {weight / total:.3f}" for corpus, weight in zip(self.train_corpora,
                                                                      weights)))
    return tuple(weight / total for weight in weights)

  def _nothing_left(self):
    raise corpora.CorpusError(f"{self.train_corpora[0].source}: no pair left for training (all "
                              "empty, invalid or over {max_length})",
                              max_length=self.config.max_length)

  def _find(self, prefix, lang):
    c = self.config
    return (corpora.find_corpus_file(c.data_dir, prefix, c.src_lang),
            corpora.find_corpus_file(c.data_dir, prefix, lang))

  def _scan(self, name, paths):
    scan = corpora.scan_parallel(*paths, on_bad_line=self.config.on_bad_line)
    logging.info("%s: %d lines in %s; %d empty pairs dropped; %d non-UTF-8 pairs skipped",
                 name, scan.num_lines, " / ".join(paths), scan.empty_pairs, len(scan.bad_lines))
    return scan

  def _build_vocabulary(self, model_dir):
    sides = {"both": ("source", "target"), "source": ("source",), "target": ("target",)}

    def sentences(side):
      read = set()  # a source file shared by several target languages is read once
      for corpus in self.train_corpora:
        paths = [getattr(corpus, name) for name in sides[side]]
        paths = [path for path in paths if path not in read]
        read.update(paths)
        yield from corpora.iterate_sentences(paths, corpus.scan.bad_lines)

    return tokenizer.ensure_vocabulary(model_dir, self.config, sentences)

  def _tagged(self, pairs, lang):
    """A multilingual model's pairs get `lang`'s token before each source."""
    return language_tags.tag_sources(pairs, lang) if self.multilingual else pairs

  def _corpus_pairs(self, corpus: Corpus):
    pairs = pipeline.text_pairs(corpus.source, corpus.target, skip_lines=corpus.scan.bad_lines)
    return self._tagged(pairs, corpus.lang)

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
      streams.append((pairs, min(c.shuffle_buffer, corpus.scan.num_lines)))
    return pipeline.train_batches(streams, self.vocabulary, c.max_length, c.batch_tokens, seed,
                                  self.train_weights, c.subword_alpha, c.subword_nbest_size,
                                  c.subword_sides, c.source_token_dropout,
                                  language_tags.TAG_PIECES if self.multilingual else 0)

  def dev_batches(self):
    """One pass over the dev set(s) in bucketed batches (for the dev loss), or None."""
    if not self.dev_sets:
      return None
    pairs = pipeline.concatenated([
        self._tagged(pipeline.text_pairs(source, target, skip_lines=scan.bad_lines), lang)
        for lang, (source, target, scan) in self.dev_sets.items()])
    return pipeline.eval_batches(pairs, self.vocabulary, self.config.max_length,
                                 self.config.batch_tokens)

  def _as_text(self, pairs, lang):
    """Python string pairs, a multilingual model's sources tagged with `lang`."""
    if not self.multilingual:
      return pairs
    sources = language_tags.tagged([source for source, _ in pairs], lang)
    return [(source, target) for source, (_, target) in zip(sources, pairs)]

  def dev_pairs(self, limit: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Each target language's first `limit` (0: all) dev pairs as Python strings (for BLEU):
    {language: pairs}, {} without a dev set."""
    return {lang: self._as_text(corpora.read_parallel(source, target, limit=limit,
                                                      skip_lines=scan.bad_lines), lang)
            for lang, (source, target, scan) in self.dev_sets.items()}

  def test_pairs(self) -> dict[str, list[tuple[str, str]]]:
    """Each target language's test pairs as Python strings: {language: pairs}, {} without
    a test_prefix."""
    sets = {}
    for lang, paths in self.test_paths.items():
      scan = corpora.scan_parallel(*paths, on_bad_line=self.config.on_bad_line)
      sets[lang] = self._as_text(corpora.read_parallel(*paths, skip_lines=scan.bad_lines), lang)
    return sets


def open_data(config, model_dir: str):
  """The task data `config` names: TFDS (dataset="tfds:NAME") or text files (data_dir)."""
  if config.dataset:
    from data_pipeline.tfds_data import TfdsData
    return TfdsData(config, model_dir)
  return ParallelData(config, model_dir)
