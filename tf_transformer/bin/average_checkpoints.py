"""Averages the weights of a model's newest checkpoints:
`python -m tf_transformer.bin.average_checkpoints --model_dir=DIR --last=N`.

Writes DIR/average/ckpt-<step> (the newest step averaged): the element-wise mean of the model
weights of the N newest training checkpoints DIR's `checkpoint` file records, and
DIR/average/average.json naming them. translate, evaluate and the exports load it with
--checkpoint=average.
"""

from absl import flags

from tf_transformer.bin import cli, shared_flags  # noqa: F401  (shared_flags: the shared flags)

flags.DEFINE_integer("last", None, "Average the weights of this many newest training "
                     "checkpoints of --model_dir.", lower_bound=1)

FLAGS = flags.FLAGS


def main(argv):
  cli.start(argv)
  from tf_transformer import checkpoints

  print(checkpoints.average(FLAGS.model_dir, FLAGS.last))


def run():
  cli.run(main, required_flags=("model_dir", "last"))


if __name__ == "__main__":
  run()
