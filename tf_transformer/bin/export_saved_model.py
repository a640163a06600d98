"""Exports a trained model for TF Serving: `python -m tf_transformer.bin.export_saved_model
--flagfile=flags/<preset>.cfg --export_dir=exports/<name>`.

Writes `exports/<name>/<version>/` (version = the checkpoint step, or the next free number)
with the signatures serving_default, translate_nbest, score and align, and TF Serving warm-up
requests for each, and `exports/<name>/batching_parameters.txt` unless one is there. The export
dir may be any TensorFlow file system path (gs://...). The search is XLA-compiled unless
--nodecode_jit (TF Serving then needs --xla_cpu_compilation_enabled=true on CPU).
--precision=int8 or bfloat16 stores the matrices of the model's products in 8 or 16 bits
(tf_transformer/layers/low_precision.py): faster decoding, a small BLEU cost (docs/serving.md).
"""

from absl import flags

from tf_transformer import config
from tf_transformer.bin import cli

flags.DEFINE_string("export_dir", None, "The model's folder in a TF Serving model base path.")
flags.DEFINE_enum("precision", "float32", ["float32", "bfloat16", "int8"],
                  "Weights of the matrix products: float32 (exact), bfloat16, or int8 (per-column "
                  "scales, rows quantised as they are multiplied).")

FLAGS = flags.FLAGS


def main(argv):
  cli.start(argv)
  from export import serving

  print(serving.export(FLAGS.model_dir, FLAGS.src_lang, FLAGS.tgt_lang, FLAGS.export_dir,
                       config.decode_config_from_flags(), FLAGS.checkpoint, FLAGS.precision))


def run():
  FLAGS.set_default("decode_jit", True)  # a server decodes for long: the compilations pay
  cli.run(main, required_flags=("model_dir", "export_dir"))


if __name__ == "__main__":
  run()
