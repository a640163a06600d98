"""Turns local parallel files into a TFDS dataset that training streams from its shards:

    python -m tf_transformer.build_dataset --src train.en --tgt train.de --src_lang=en \\
        --tgt_lang=de [--dev_src val.en --dev_tgt val.de] [--test_src test.en --test_tgt test.de] \\
        --name my_corpus --out data/tfds
    python -m tf_transformer.train --flagfile=flags/small.cfg --dataset=tfds:my_corpus \\
        --tfds_data_dir=data/tfds --src_lang=en --tgt_lang=de --model_dir=models/my_corpus

The files are validated first (line counts, UTF-8: --on_bad_line), then written as the
train/validation/test splits of a TFDS translation dataset.
"""


from absl import flags, logging

from data_pipeline import tfds_data
from tf_transformer import config, console

flags.adopt_module_key_flags(config)  # --helpshort lists the project's flags

FLAGS = config.FLAGS
_SPLIT_FLAGS = {tfds_data.TRAIN: ("src", "tgt"), tfds_data.DEV: ("dev_src", "dev_tgt"),
                tfds_data.TEST: ("test_src", "test_tgt")}


def _split_files() -> dict:
  """{split: (source path, target path)} from the flags; FlagError on half-given pairs."""
  splits = {}
  for split, (src, tgt) in _SPLIT_FLAGS.items():
    paths = FLAGS[src].value, FLAGS[tgt].value
    if split == tfds_data.TRAIN and not all(paths):
      raise config.FlagError("--src and --tgt (the training corpus) are required")
    if any(paths) and not all(paths):
      raise config.FlagError(f"--{src} and --{tgt} go together")
    if all(paths):
      splits[split] = paths
  return splits


def main(argv):
  console.start(argv)
  if not FLAGS.name or not FLAGS.out:
    raise config.FlagError("--name and --out are required")
  builder = tfds_data.build_dataset(_split_files(), FLAGS.name, FLAGS.out, FLAGS.src_lang,
                                    FLAGS.tgt_lang, FLAGS.on_bad_line)
  splits = builder.info.splits
  logging.info("wrote %s: %s", builder.data_dir,
               ", ".join(f"{name} {splits[name].num_examples} pairs in "
                         f"{splits[name].num_shards} shards" for name in splits))
  print(f"train with --dataset={tfds_data.PREFIX}{FLAGS.name} --tfds_data_dir={FLAGS.out}")


if __name__ == "__main__":
  console.run(main)
