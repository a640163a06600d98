"""Downloads a public parallel corpus and checks every file before keeping it:
`python -m tf_transformer.download {multi30k|iwslt15_en_vi|iwslt17_de_en} --out DIR
[--base_url URL]`.

The datasets, their sources and licenses are listed in data_pipeline/public_corpora.py.
"""

import os

from absl import flags

from data_pipeline.public_corpora import DATASETS, download
from tf_transformer import config, console

flags.adopt_module_key_flags(config)  # --helpshort lists the project's flags

FLAGS = config.FLAGS


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    raise console.UserError(f"usage: python -m tf_transformer.download "
                            f"{{{'|'.join(DATASETS)}}} --out DIR [--base_url URL]")
  out = FLAGS.out or os.path.join("data", argv[1])
  paths = download(argv[1], out, base_url=FLAGS.base_url)
  print(f"{len(paths)} files checked in {out}")


if __name__ == "__main__":
  console.run(main)
