"""Turns local parallel files into a TFDS dataset that training streams from its shards:

    python -m data_pipeline.build --src train.en --tgt train.de --src_lang=en --tgt_lang=de \\
        [--dev_src val.en --dev_tgt val.de] [--test_src test.en --test_tgt test.de] \\
        --name my_corpus --out data/tfds
    python -m tf_transformer.train --flagfile=flags/small.cfg --dataset=tfds:my_corpus \\
        --tfds_data_dir=data/tfds --src_lang=en --tgt_lang=de --model_dir=models/my_corpus

Splits train, validation and test, one Translation feature keyed by language (the layout of
TFDS's public translation datasets). The files are validated first (line counts, UTF-8:
--on_bad_line), streamed pair by pair, and written as shuffled, sharded TFRecord files.
"""

import sys

import tensorflow_datasets as tfds
from absl import app, logging

from data_pipeline import corpora, tfds_data
from data_pipeline import download  # noqa: F401  (defines --out, shared with the download CLI)
from tf_transformer import config, console

FLAGS = config.FLAGS
VERSION = "1.0.0"


def _split_files() -> dict:
  """{split: (source path, target path)} from the flags; FlagError on half-given pairs."""
  splits = {}
  for split, (src, tgt) in {tfds_data.TRAIN: ("src", "tgt"), tfds_data.DEV: ("dev_src", "dev_tgt"),
                            tfds_data.TEST: ("test_src", "test_tgt")}.items():
    paths = FLAGS[src].value, FLAGS[tgt].value
    if split == tfds_data.TRAIN and not all(paths):
      raise config.FlagError("--src and --tgt (the training corpus) are required")
    if any(paths) and not all(paths):
      raise config.FlagError(f"--{src} and --{tgt} go together")
    if all(paths):
      splits[split] = paths
  return splits


def build(splits: dict, name: str, out: str, src_lang: str, tgt_lang: str,
          on_bad_line: str = "error"):
  """Writes `splits` ({split: (source path, target path)}) as TFDS dataset `name` in `out`.

  Raises:
    CorpusError: a file is missing, empty, not line-aligned or (with on_bad_line="error")
      not UTF-8.
  """
  if src_lang == tgt_lang:
    raise config.FlagError(f"--src_lang and --tgt_lang must differ, both are {src_lang!r}")
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
      name=name, version=VERSION, data_dir=out,
      features=tfds.features.Translation(languages=[src_lang, tgt_lang]),
      split_datasets={split: examples(split) for split in splits},
      description=f"{src_lang}-{tgt_lang} parallel text from " + ", ".join(
          f"{split}: {' + '.join(paths)}" for split, paths in splits.items()))
  return builder


def main(argv):
  console.start(argv)
  try:
    if not FLAGS.name or not FLAGS.out:
      raise config.FlagError("--name and --out are required")
    builder = build(_split_files(), FLAGS.name, FLAGS.out, FLAGS.src_lang, FLAGS.tgt_lang,
                    FLAGS.on_bad_line)
  except (config.FlagError, corpora.CorpusError) as e:
    sys.exit(f"error: {e}")
  splits = builder.info.splits
  logging.info("wrote %s: %s", builder.data_dir,
               ", ".join(f"{name} {splits[name].num_examples} pairs in "
                         f"{splits[name].num_shards} shards" for name in splits))
  print(f"train with --dataset={tfds_data.PREFIX}{FLAGS.name} --tfds_data_dir={FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
