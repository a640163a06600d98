"""Exports a trained model to CTranslate2: `python -m tf_transformer.bin.export_ctranslate2
--flagfile=flags/<preset>.cfg --output_dir=DIR [--quantization=int8]`.

Writes a CTranslate2 model folder (model.bin, config.json, the vocabularies) with the
SentencePiece model(s) beside it, from the model directory's --checkpoint (default: the best).
The folder is written under a temporary name and renamed at the end.
"""

from absl import flags

from tf_transformer.bin import cli, shared_flags  # noqa: F401  (shared_flags: the shared flags)

flags.DEFINE_string("output_dir", None, "The CTranslate2 model folder.")
flags.DEFINE_enum("quantization", "float32",
                  ["float32", "int8", "int8_float32", "int16", "float16", "bfloat16"],
                  "Weight type of the CTranslate2 model.")

FLAGS = flags.FLAGS


def main(argv):
  cli.start(argv)
  from export import ctranslate2

  print(ctranslate2.export(FLAGS.model_dir, FLAGS.src_lang, FLAGS.tgt_lang, FLAGS.output_dir,
                           FLAGS.quantization, FLAGS.checkpoint))


def run():
  cli.run(main, required_flags=("model_dir", "output_dir"))


if __name__ == "__main__":
  run()
