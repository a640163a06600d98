"""How much --subword_alpha changes the training segmentations: for each (alpha, n-best size),
the mean pieces a sentence and the share of sentences segmented as the one best.

    python -m bench.studies.subword_sampling --spm_model=models/multi30k_en_de/spm.joint.model \\
        --sentences=data/multi30k/val.en.gz --settings=0.1:-1,0.2:-1,0.5:-1,1.0:-1,0.1:64

Each sentence of --sentences (the first --limit) is segmented once per setting, as the training
pipeline segments it (data_pipeline.tokenizer.load_tokenizer). The last line is JSON.
"""

import gzip
import json

from absl import app, flags

flags.DEFINE_string("spm_model", None, "A SentencePiece .model file.", required=True)
flags.DEFINE_string("sentences", None, "Sentences, one per line (.gz read too).", required=True)
flags.DEFINE_integer("limit", 1000, "Sentences read.")
flags.DEFINE_list("settings", ["0.1:-1", "0.2:-1", "0.5:-1", "1.0:-1"],
                  "alpha:nbest_size pairs.")
FLAGS = flags.FLAGS


def main(argv):
  import numpy as np

  from data_pipeline import tokenizer

  opener = gzip.open if FLAGS.sentences.endswith(".gz") else open
  with opener(FLAGS.sentences, "rt", encoding="utf-8") as lines:
    sentences = [line.strip() for _, line in zip(range(FLAGS.limit), lines)]
  best = tokenizer.load_tokenizer(FLAGS.spm_model).tokenize(sentences).to_list()
  rows = [{"alpha": 0.0, "nbest_size": 1, "pieces": float(np.mean([len(b) for b in best])),
           "same_as_best": 1.0}]
  for setting in FLAGS.settings:
    alpha, nbest_size = setting.split(":")
    sampler = tokenizer.load_tokenizer(FLAGS.spm_model, float(alpha), int(nbest_size))
    sampled = sampler.tokenize(sentences).to_list()
    rows.append({"alpha": float(alpha), "nbest_size": int(nbest_size),
                 "pieces": float(np.mean([len(s) for s in sampled])),
                 "same_as_best": float(np.mean([s == b for s, b in zip(sampled, best)]))})
  for row in rows:
    print(f"alpha {row['alpha']:.2f}, n-best {row['nbest_size']:3d}: "
          f"{row['pieces']:.1f} pieces a sentence, {row['same_as_best']:.0%} as the best")
  print(json.dumps({"sentences": len(sentences), "rows": rows}))


if __name__ == "__main__":
  app.run(main)
