"""Turns local parallel files into a TFDS dataset that training streams from its shards:

    python -m tf_transformer.bin.build_dataset --src train.en --tgt train.de --src_lang=en \\
        --tgt_lang=de [--dev_src val.en --dev_tgt val.de] [--test_src test.en \\
        --test_tgt test.de] --name my_corpus --out data/tfds
    python -m tf_transformer.train --flagfile=flags/small.cfg --dataset=tfds:my_corpus \\
        --tfds_data_dir=data/tfds --src_lang=en --tgt_lang=de --model_dir=models/my_corpus

The files are validated first (line counts, UTF-8: --on_bad_line), then written as the
train/validation/test splits of a TFDS translation dataset.
"""

from absl import flags, logging

from tf_transformer.bin import cli, shared_flags  # noqa: F401  (shared_flags: the shared flags)
from tf_transformer.bin.cli import FlagError

# --src, --tgt and --out also name other tools' files: whichever tool runs defines them
flags.DEFINE_string("src", None, "The training corpus's source side (plain or .gz).",
                    allow_override=True)
flags.DEFINE_string("tgt", None, "The training corpus's target side.", allow_override=True)
flags.DEFINE_string("dev_src", None, "Dev source file (optional).")
flags.DEFINE_string("dev_tgt", None, "Dev target file.")
flags.DEFINE_string("test_src", None, "Test source file (optional).")
flags.DEFINE_string("test_tgt", None, "Test target file.")
flags.DEFINE_string("name", None, "Name of the TFDS dataset.")
flags.DEFINE_string("out", None, "The TFDS data folder the dataset is written in.",
                    allow_override=True)

FLAGS = flags.FLAGS


def _split_files(tfds_data) -> dict:
  """{split: (source path, target path)} from the flags; FlagError on half-given pairs."""
  splits = {tfds_data.TRAIN: (FLAGS.src, FLAGS.tgt)}
  for split, (src, tgt) in ((tfds_data.DEV, ("dev_src", "dev_tgt")),
                            (tfds_data.TEST, ("test_src", "test_tgt"))):
    paths = FLAGS[src].value, FLAGS[tgt].value
    if any(paths) and not all(paths):
      raise FlagError(f"--{src} and --{tgt} go together")
    if all(paths):
      splits[split] = paths
  return splits


def main(argv):
  cli.start(argv)
  from data_pipeline import tfds_data

  builder = tfds_data.build_dataset(_split_files(tfds_data), FLAGS.name, FLAGS.out,
                                    FLAGS.src_lang, FLAGS.tgt_lang, FLAGS.on_bad_line)
  splits = builder.info.splits
  logging.info("wrote %s: %s", builder.data_dir,
               ", ".join(f"{name} {splits[name].num_examples} pairs in "
                         f"{splits[name].num_shards} shards" for name in splits))
  print(f"train with --dataset={tfds_data.PREFIX}{FLAGS.name} --tfds_data_dir={FLAGS.out}")


def run():
  cli.run(main, required_flags=("src", "tgt", "name", "out"))


if __name__ == "__main__":
  run()
