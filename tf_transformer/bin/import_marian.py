"""Imports a published Marian model (OPUS-MT's Hugging Face format) as a model directory:
`python -m tf_transformer.bin.import_marian --from=DIR --model_dir=OUT`.

DIR holds config.json, model.safetensors, source.spm, target.spm and vocab.json (as OPUS-MT
publishes them; download the folder with your own tools). OUT then serves every tool without a
preset: translate, evaluate, train --init_from (fine-tuning), export_saved_model and
export_ctranslate2. Prints OUT.
"""

from absl import flags

from tf_transformer.bin import cli, shared_flags  # noqa: F401  (shared_flags: the shared flags)

flags.DEFINE_string("from", None, "The Marian model folder (config.json, model.safetensors, "
                    "source.spm, target.spm, vocab.json).")

FLAGS = flags.FLAGS


def main(argv):
  cli.start(argv)
  from tf_transformer import marian

  marian.import_model(FLAGS["from"].value, FLAGS.model_dir)
  print(FLAGS.model_dir)


def run():
  cli.run(main, required_flags=("from", "model_dir"))


if __name__ == "__main__":
  run()
