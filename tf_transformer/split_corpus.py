"""Splits a parallel corpus that has no dev or test set, deterministically:

    python -m tf_transformer.split_corpus --src=alt.ja --tgt=alt.vi --src_lang=ja --tgt_lang=vi \\
        --dev_size=1000 --test_size=1000 --seed=1234 --out=data/ja_vi_alt \\
        [--extra_src=tatoeba.ja --extra_tgt=tatoeba.vi]

writes --out/{train,dev,test}.{src_lang,tgt_lang}. The held-out pairs depend only on --seed and
the source sentences (see data_pipeline.held_out), so the same command gives the same split on
any machine; the --extra_* corpora go to train, but for pairs whose source is held out.
"""

from absl import flags, logging

from data_pipeline import held_out
from tf_transformer import config, console

flags.adopt_module_key_flags(config)  # --helpshort lists the project's flags

FLAGS = config.FLAGS


def main(argv):
  console.start(argv)
  for name in ("src", "tgt", "out", "dev_size", "test_size"):
    if FLAGS[name].value is None:
      raise config.FlagError("--src, --tgt, --out, --dev_size and --test_size are required")
  if len(FLAGS.extra_src) != len(FLAGS.extra_tgt):
    raise config.FlagError(f"--extra_src names {len(FLAGS.extra_src)} file(s) but --extra_tgt "
                           f"{len(FLAGS.extra_tgt)}; they pair up in order")
  counts = held_out.write_split(FLAGS.src, FLAGS.tgt, FLAGS.out, FLAGS.src_lang,
                                FLAGS.tgt_lang, FLAGS.dev_size, FLAGS.test_size, FLAGS.seed,
                                list(zip(FLAGS.extra_src, FLAGS.extra_tgt)),
                                FLAGS.on_bad_line)
  logging.info("wrote %s/{train,dev,test}.{%s,%s}: train %d pairs (%d from --extra_src, %d "
               "extra pairs left out as held out), dev %d, test %d", FLAGS.out, FLAGS.src_lang,
               FLAGS.tgt_lang, counts.train, counts.extra_train, counts.extra_held_out,
               counts.dev, counts.test)
  print(f"train with --data_dir={FLAGS.out} --train_prefix=train --dev_prefix=dev "
        "--test_prefix=test")


if __name__ == "__main__":
  console.run(main)
