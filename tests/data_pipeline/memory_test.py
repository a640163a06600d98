"""Memory stays flat with corpus size: the training pipeline streams (no whole-corpus lists)."""

import json
import os
import subprocess
import sys

import numpy as np

from data_pipeline import tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_ONE_PASS = """
import json, resource, sys
from data_pipeline import pipeline, tokenizer

def rss_mib():
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

lines, folder, spm = int(sys.argv[1]), sys.argv[2], sys.argv[3]
vocabulary = tokenizer.load_vocabulary(spm, spm)
pairs = pipeline.text_pairs(f"{folder}/train.src", f"{folder}/train.tgt")
batches = pipeline.train_batches(pairs, vocabulary, max_length=64, batch_tokens=4096,
                                 shuffle_buffer=10_000, seed=1)
seen, rss = 0, {}
for source_ids, _, _ in batches:
  seen += int(source_ids.shape[0])
  if seen >= lines // 10 and "tenth" not in rss:
    rss["tenth"] = rss_mib()
  if seen >= lines:
    break
print(json.dumps({"seen": seen, "rss_tenth_mib": rss["tenth"], "rss_end_mib": rss_mib(),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_corpus(folder, lines):
  rng = np.random.default_rng(0)
  words = np.array([f"w{i}" for i in range(500)])
  for side in ("src", "tgt"):
    lengths = rng.integers(1, 5, lines)
    tokens = rng.choice(words, int(lengths.sum()))
    ends = np.cumsum(lengths)
    with open(os.path.join(folder, f"train.{side}"), "w") as f:
      f.writelines(" ".join(tokens[end - n:end]) + "\n" for n, end in zip(lengths, ends))


def test_rss_stays_flat_over_a_million_line_corpus(tmp_path):
  lines = 1_000_000
  write_corpus(tmp_path, lines)
  spm = str(tmp_path / "spm.model")
  with open(tmp_path / "train.src") as f:
    tokenizer.train_sentencepiece((next(f) for _ in range(5000)), spm, 300)
  result = subprocess.run([sys.executable, "-c", _ONE_PASS, str(lines), str(tmp_path), spm],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  print(f"one pass over {lines} pairs: {report}")  # shown with pytest -s
  assert report["seen"] >= lines
  # from a tenth of the corpus to all of it, the process grows by less than 100 MiB
  assert report["rss_end_mib"] < report["rss_tenth_mib"] + 100, report
