"""Splits a parallel corpus that has no dev or test set, deterministically:

    python -m tf_transformer.bin.split_corpus --src=alt.ja --tgt=alt.vi --src_lang=ja \\
        --tgt_lang=vi --dev_size=1000 --test_size=1000 --seed=1234 --out=data/ja_vi_alt \\
        [--extra_src=tatoeba.ja --extra_tgt=tatoeba.vi [--extra_prefix=tatoeba]]

writes --out/{train,dev,test}.{src_lang,tgt_lang}. The held-out pairs depend only on --seed and
the source sentences (see data_pipeline.held_out), so the same command gives the same split on
any machine; the --extra_* corpora go to train, but for pairs whose source is held out, or with
--extra_prefix=NAME to --out/NAME.{src_lang,tgt_lang}, a training corpus of its own that
--train_prefix=train,NAME --train_weights=... weighs against train.
"""

from absl import flags, logging

from tf_transformer.bin import cli, shared_flags  # noqa: F401  (shared_flags: the shared flags)
from tf_transformer.bin.cli import FlagError

# --src, --tgt and --out also name other tools' files: whichever tool runs defines them
flags.DEFINE_string("src", None, "The corpus's source side (plain or .gz).", allow_override=True)
flags.DEFINE_string("tgt", None, "The corpus's target side.", allow_override=True)
flags.DEFINE_string("out", None, "Folder of the train/dev/test files.", allow_override=True)
flags.DEFINE_integer("dev_size", None, "Pairs held out for dev.", lower_bound=1)
flags.DEFINE_integer("test_size", None, "Pairs held out for test.", lower_bound=1)
flags.DEFINE_list("extra_src", [], "Source files added to train (comma-separated; pairs with a "
                  "held-out source are left out).")
flags.DEFINE_list("extra_tgt", [], "The target sides of --extra_src, in the same order.")
flags.DEFINE_string("extra_prefix", "train", "Where the --extra_src pairs go: appended to train "
                    "(the default), or a corpus of this name of their own.")

FLAGS = flags.FLAGS


def main(argv):
  cli.start(argv)
  from data_pipeline import held_out

  if len(FLAGS.extra_src) != len(FLAGS.extra_tgt):
    raise FlagError(f"--extra_src names {len(FLAGS.extra_src)} file(s) but --extra_tgt "
                           f"{len(FLAGS.extra_tgt)}; they pair up in order")
  if FLAGS.extra_prefix in ("", "dev", "test"):
    raise FlagError(f"--extra_prefix={FLAGS.extra_prefix!r} must name a training corpus, not "
                    "a held-out split")
  counts = held_out.write_split(FLAGS.src, FLAGS.tgt, FLAGS.out, FLAGS.src_lang,
                                FLAGS.tgt_lang, FLAGS.dev_size, FLAGS.test_size, FLAGS.seed,
                                list(zip(FLAGS.extra_src, FLAGS.extra_tgt)),
                                FLAGS.on_bad_line, FLAGS.extra_prefix)
  separate = FLAGS.extra_src and FLAGS.extra_prefix != "train"
  logging.info("wrote %s/{train,dev,test%s}.{%s,%s}: train %d pairs (%d from --extra_src%s, %d "
               "extra pairs left out as held out), dev %d, test %d", FLAGS.out,
               f",{FLAGS.extra_prefix}" if separate else "", FLAGS.src_lang, FLAGS.tgt_lang,
               counts.train, counts.extra_train, f" in {FLAGS.extra_prefix}" if separate else "",
               counts.extra_held_out, counts.dev, counts.test)
  train = f"train,{FLAGS.extra_prefix}" if separate else "train"
  print(f"train with --data_dir={FLAGS.out} --train_prefix={train} --dev_prefix=dev "
        "--test_prefix=test")


def run():
  cli.run(main, required_flags=("src", "tgt", "out", "dev_size", "test_size"))


if __name__ == "__main__":
  run()
