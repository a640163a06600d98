"""Downloads a public parallel corpus and checks every file before keeping it:
`python -m tf_transformer.download {multi30k|iwslt15_en_vi|iwslt17_de_en} --out DIR
[--base_url URL]`.

The datasets, their sources and licenses are listed in data_pipeline/public_corpora.py.
"""

import os
import sys

from absl import app

from data_pipeline.public_corpora import DATASETS, DownloadError, download
from tf_transformer import config

FLAGS = config.FLAGS


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    sys.exit(f"error: usage: python -m tf_transformer.download {{{'|'.join(DATASETS)}}} "
             "--out DIR [--base_url URL]")
  out = FLAGS.out or os.path.join("data", argv[1])
  try:
    paths = download(argv[1], out, base_url=FLAGS.base_url)
  except (DownloadError, OSError) as e:
    sys.exit(f"error: {e}")
  print(f"{len(paths)} files checked in {out}")


if __name__ == "__main__":
  app.run(main)
