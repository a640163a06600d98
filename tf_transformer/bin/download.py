"""Downloads a public parallel corpus and checks every file before keeping it:
`python -m tf_transformer.bin.download {multi30k|iwslt15_en_vi|iwslt17_de_en} --out DIR
[--base_url URL]`.

The datasets, their sources and licenses are listed in data_pipeline/public_corpora.py.
"""

import os

from absl import flags

from common.errors import UserError
from tf_transformer.bin import cli

# --out also names other tools' outputs: whichever tool runs defines it
flags.DEFINE_string("out", None, "Output folder (default: data/<dataset>).", allow_override=True)
flags.DEFINE_string("base_url", None, "Overrides the URL the dataset files are fetched from.")

FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  from data_pipeline.public_corpora import DATASETS, download  # needs no TensorFlow

  if len(argv) != 2:
    raise UserError(f"usage: python -m tf_transformer.bin.download "
                    f"{{{'|'.join(DATASETS)}}} --out DIR [--base_url URL]")
  out = FLAGS.out or os.path.join("data", argv[1])
  paths = download(argv[1], out, base_url=FLAGS.base_url)
  print(f"{len(paths)} files checked in {out}")


def run():
  cli.run(main)


if __name__ == "__main__":
  run()
