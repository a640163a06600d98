"""A translation task's data in TFDS format: a public dataset by name (dataset="tfds:NAME/CONFIG",
e.g. wmt14_translate/de-en), or one built from local files by `build_dataset`
(`python -m tf_transformer.bin.build_dataset`).

Splits: "train" (sharded per worker at the file level; train_prefix names other training
splits, several drawn from by train_weights), "validation" (dev loss, BLEU and the best
checkpoint) and "test" (scored after training), each used when the dataset has it.
"""

import itertools

import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

from data_pipeline import corpora, pipeline, tokenizer
from data_pipeline.corpora import CorpusError

PREFIX = "tfds:"
TRAIN, DEV, TEST = "train", "validation", "test"
_BUILD_VERSION = "1.0.0"


def prepared_builder(name: str, data_dir: str | None):
  """The TFDS builder of `name`, its records prepared under `data_dir` (downloaded if needed).

  Raises:
    CorpusError: unknown dataset, or not prepared and not downloadable (e.g. offline).
  """
  where = "{tfds_data_dir}" if data_dir else "the default TFDS folder"
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # TFDS raises several types for unknown names and bad folders
    raise CorpusError(f"{PREFIX}{name}: no such TFDS dataset, registered or built in {where} "
                      f"({_first_line(e)})", tfds_data_dir=data_dir) from None
  if builder.is_prepared():
    return builder
  logging.info("%s%s is not in %s: downloading and preparing it (this needs internet access; "
               "offline, the download retries for a few minutes before failing)", PREFIX, name,
               f"tfds_data_dir={data_dir}" if data_dir else where)
  try:
    builder.download_and_prepare()
  except Exception as e:  # network, checksum and disk errors all end the same way for the user
    raise CorpusError(f"{PREFIX}{name}: not prepared in {where} and cannot be downloaded "
                      f"and prepared here ({_first_line(e)}); prepare it on a machine with "
                      "internet access and copy the folder, or pass {tfds_data_dir:name}",
                      tfds_data_dir=data_dir) from None
  return builder


def _first_line(error: Exception) -> str:
  text = str(error).strip()
  return text.splitlines()[0][:200] if text else type(error).__name__


class TfdsData:
  """ParallelData's interface over a TFDS translation dataset."""

  def __init__(self, config, model_dir: str):
    """Args: config: a DataConfig with `dataset`; model_dir: where the subword models live."""
    self.config = config
    c = config
    self.name = c.dataset[len(PREFIX):]
    self.builder = prepared_builder(self.name, c.tfds_data_dir)
    info = self.builder.info
    languages = tuple(getattr(info.features, "languages", None) or info.features.keys())
    missing = [lang for lang in (c.src_lang, c.tgt_lang) if lang not in languages]
    if missing:
      raise CorpusError(f"{c.dataset}: no language {', '.join(missing)} (it has "
                        f"{', '.join(languages)}); set {{src_lang:name}} and {{tgt_lang:name}}",
                        src_lang=None, tgt_lang=None)
    self.train_splits = c.train_prefixes
    for split in self.train_splits:
      if split not in info.splits:
        raise CorpusError(f"{c.dataset}: no '{split}' split (it has {', '.join(info.splits)}); "
                          "check {train_prefix}", train_prefix=c.train_prefix)
    self.splits = set(info.splits)
    self.train_sizes = [info.splits[split].num_examples for split in self.train_splits]
    logging.info("%s: %d training pairs; splits %s", c.dataset, sum(self.train_sizes),
                 ", ".join(sorted(self.splits)))
    weights = c.train_weights or tuple(float(size) for size in self.train_sizes)
    self.train_weights = tuple(weight / sum(weights) for weight in weights)
    self.vocabulary = tokenizer.ensure_vocabulary(model_dir, c, self._sentences)

  def _pairs(self, split, seed: int | None = None):
    """tf.data of stripped, non-empty (source, target) strings of `split`."""
    read_config = tfds.ReadConfig(shuffle_seed=seed)
    dataset = self.builder.as_dataset(split=split, shuffle_files=seed is not None,
                                      read_config=read_config)
    src, tgt = self.config.src_lang, self.config.tgt_lang
    return pipeline.drop_empty_pairs(dataset.map(
        lambda example: (tf.strings.strip(example[src]), tf.strings.strip(example[tgt]))))

  def _sentences(self, side):
    """Up to spm_input_sentences training sentences of `side` per language, each training
    split giving its share by size (records are shuffled when TFDS writes them, so a split's
    first ones are a random sample of it)."""
    c = self.config
    total = sum(self.train_sizes)
    for split, size in zip(self.train_splits, self.train_sizes):
      share = -(-c.spm_input_sentences * size // total)
      for source, target in tfds.as_numpy(self._pairs(split).take(share)):
        if side in ("both", "source"):
          yield source.decode("utf-8", errors="replace")
        if side in ("both", "target"):
          yield target.decode("utf-8", errors="replace")

  def train_pairs(self):
    """tf.data of the training (source, target) strings, every training split once, in
    order."""
    return self._pairs("+".join(self.train_splits))  # TFDS's split algebra

  def train_batches(self, seed: int, num_shards: int = 1, shard: int = 0):
    """Endless training batches of this worker's share of each training split's record
    files, the splits drawn from by their weights."""
    c = self.config
    streams = []
    for index, (split, size) in enumerate(zip(self.train_splits, self.train_sizes)):
      if num_shards > 1:
        split = tfds.even_splits(split, n=num_shards)[shard]
      # no larger than the split (see ParallelData.train_batches)
      streams.append((self._pairs(split, seed + index), min(c.shuffle_buffer, size)))
    return pipeline.train_batches(streams, self.vocabulary, c.max_length, c.batch_tokens, seed,
                                  self.train_weights, c.subword_alpha, c.subword_nbest_size,
                                  c.subword_sides, c.source_token_dropout)

  def dev_batches(self):
    if DEV not in self.splits:
      return None
    c = self.config
    return pipeline.eval_batches(self._pairs(DEV), self.vocabulary, c.max_length,
                                 c.batch_tokens)

  def _as_text(self, split, limit: int = 0) -> dict[str, list[tuple[str, str]]]:
    """{target language: the first `limit` (0: all) pairs of `split`}, {} without the split."""
    if split not in self.splits:
      return {}
    pairs = tfds.as_numpy(self._pairs(split))
    pairs = [(s.decode("utf-8"), t.decode("utf-8"))
             for s, t in itertools.islice(pairs, limit or None)]
    return {self.config.tgt_lang: pairs} if pairs else {}

  def dev_pairs(self, limit: int = 0) -> dict[str, list[tuple[str, str]]]:
    """{target language: the first `limit` (0: all) dev pairs}, {} without a dev split."""
    return self._as_text(DEV, limit)

  def test_pairs(self) -> dict[str, list[tuple[str, str]]]:
    """{target language: every test pair}, {} without a test split."""
    return self._as_text(TEST)


def build_dataset(splits: dict, name: str, out: str, src_lang: str, tgt_lang: str,
                  on_bad_line: str = "error"):
  """Writes `splits` ({split: (source path, target path)}) as TFDS dataset `name` in `out`.

  Splits train, validation and test, one Translation feature keyed by language (the layout of
  TFDS's public translation datasets). The files are validated first (line counts, UTF-8),
  streamed pair by pair, and written as shuffled, sharded TFRecord files.

  Raises:
    CorpusError: the languages are the same, or a file is missing, empty, not line-aligned or
      (with on_bad_line="error") not UTF-8.
  """
  if src_lang == tgt_lang:
    raise corpora.CorpusError(f"{{src_lang:name}} and {{tgt_lang:name}} must differ, both are "
                              f"{src_lang!r}", src_lang=None, tgt_lang=None)
  scans = {split: corpora.scan_parallel(*paths, on_bad_line=on_bad_line)
           for split, paths in splits.items()}

  def examples(split):
    pairs = corpora.iterate_parallel(*splits[split], skip_lines=scans[split].bad_lines)
    for number, (source, target) in enumerate(pairs):
      yield number, {src_lang: source, tgt_lang: target}

  for split, scan in scans.items():
    logging.info("%s: %d lines; %d empty pairs dropped; %d non-UTF-8 pairs skipped", split,
                 scan.num_lines, scan.empty_pairs, len(scan.bad_lines))
  builder = tfds.dataset_builders.store_as_tfds_dataset(
      name=name, version=_BUILD_VERSION, data_dir=out,
      features=tfds.features.Translation(languages=[src_lang, tgt_lang]),
      split_datasets={split: examples(split) for split in splits},
      description=f"{src_lang}-{tgt_lang} parallel text from " + ", ".join(
          f"{split}: {' + '.join(paths)}" for split, paths in splits.items()))
  return builder
