"""Throughput of the training input pipeline alone: text files -> tokenized, bucketed batches.

    python -m bench.input_speed [--lines 200000] [--batch_tokens 4096]

Writes a corpus of --lines random sentence pairs (lengths uniform in [--min_words,
--max_words] words, a SentencePiece model trained on a sample of it), then times
`pipeline.train_batches` (shuffle, in-graph tokenization, length buckets, decoder inputs) over
one pass of it. Compare its target tokens/s with what the train step consumes
(bench/train_speed.py's tgt_tok_per_s): the pipeline must keep well ahead. The last line is one
JSON object.
"""

import json
import os
import resource
import sys
import time

from absl import app, flags

flags.DEFINE_integer("lines", 200_000, "Sentence pairs in the generated corpus.")
flags.DEFINE_integer("min_words", 3, "Shortest sentence, in words.")
flags.DEFINE_integer("max_words", 30, "Longest sentence, in words.")
flags.DEFINE_integer("vocab_size", 8000, "SentencePiece vocabulary size.")
flags.DEFINE_integer("batch_tokens", 4096, "Tokens per batch (the small preset's).")
flags.DEFINE_integer("max_length", 100, "Longest kept side, in subword tokens.")
flags.DEFINE_string("workdir", "/tmp/tf_transformer_input_bench", "Corpus and subword model.")
FLAGS = flags.FLAGS


def write_corpus(folder: str, lines: int, rng):
  """train.src / train.tgt of `lines` random pairs; returns their paths."""
  words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 9)))
           for _ in range(20000)]
  paths = os.path.join(folder, "train.src"), os.path.join(folder, "train.tgt")
  with open(paths[0], "w") as src, open(paths[1], "w") as tgt:
    for _ in range(lines):
      for f in (src, tgt):
        f.write(" ".join(rng.choice(words, rng.integers(FLAGS.min_words, FLAGS.max_words + 1)))
                + "\n")
  return paths


def main(argv):
  import itertools

  import numpy as np

  from data_pipeline import corpora, pipeline, tokenizer

  rng = np.random.default_rng(0)
  folder = os.path.join(FLAGS.workdir, str(FLAGS.lines))
  os.makedirs(folder, exist_ok=True)
  paths = os.path.join(folder, "train.src"), os.path.join(folder, "train.tgt")
  if not all(os.path.exists(p) for p in paths):
    paths = write_corpus(folder, FLAGS.lines, rng)
  spm = os.path.join(folder, "spm.model")
  if not os.path.exists(spm):
    sample = itertools.islice(corpora.iterate_sentences(paths), 100_000)
    tokenizer.train_sentencepiece(sample, spm, FLAGS.vocab_size)
  vocabulary = tokenizer.load_vocabulary(spm, spm)

  batches = pipeline.train_batches([(pipeline.text_pairs(*paths), 100_000)], vocabulary,
                                   FLAGS.max_length, FLAGS.batch_tokens, seed=1)
  examples = tokens = 0
  start = time.perf_counter()
  for _, _, target_ids in batches:
    examples += int(target_ids.shape[0])
    tokens += int(np.count_nonzero(target_ids.numpy()))
    if examples >= FLAGS.lines:
      break
  elapsed = time.perf_counter() - start
  result = {"lines": FLAGS.lines, "examples": examples, "elapsed_s": elapsed,
            "examples_per_s": examples / elapsed, "tgt_tok_per_s": tokens / elapsed,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
  print(f"{result['examples_per_s']:.0f} examples/s, {result['tgt_tok_per_s']:.0f} target "
        f"tokens/s, peak RSS {result['peak_rss_mib']:.0f} MiB", file=sys.stderr)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
