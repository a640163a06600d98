"""Exports a trained model to CTranslate2: `python -m tf_transformer.bin.export_ctranslate2
--flagfile=flags/<preset>.cfg --output_dir=DIR [--quantization=int8]`.

Writes a CTranslate2 model folder (model.bin, config.json, the vocabularies) with the
SentencePiece model(s) beside it, from the model directory's --checkpoint (default: the best).
The folder is written under a temporary name and renamed at the end.
"""

from absl import flags

from tf_transformer.bin import cli, shared_flags  # noqa: F401  (shared_flags: the shared flags)
from tf_transformer.bin.cli import FlagError

flags.DEFINE_string("output_dir", None, "The CTranslate2 model folder.")
flags.DEFINE_enum("quantization", "float32",
                  ["float32", "int8", "int8_float32", "int16", "float16", "bfloat16"],
                  "Weight type of the CTranslate2 model.")

FLAGS = flags.FLAGS


def main(argv):
  cli.start(argv)
  if FLAGS.ensemble:
    raise FlagError("the CTranslate2 format has no ensembles (CTranslate2 declined them): "
                    "export one model with --model_dir, or the ensemble with "
                    "export_saved_model --ensemble")
  if not FLAGS.model_dir:
    raise FlagError("--model_dir is required (see --helpfull)")
  import export
  from export import ctranslate2

  options = ctranslate2.Options(FLAGS.src_lang, FLAGS.tgt_lang, FLAGS.quantization,
                                FLAGS.checkpoint)
  print(export.exporter("ctranslate2")(FLAGS.model_dir, FLAGS.output_dir, options))


def run():
  cli.run(main, required_flags=("output_dir",))  # and --model_dir, checked after --ensemble


if __name__ == "__main__":
  run()
