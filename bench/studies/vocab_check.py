"""How SentencePiece's unigram and BPE models segment one side of a corpus.

    python -m bench.studies.vocab_check --text=data/ja_vi_alt/train.vi [--vocab_size 8000]

Trains both model types on the file (plain text or .gz, one sentence a line) with the project's
own trainer (`data_pipeline.tokenizer.train_sentencepiece`), then prints for each: pieces per
sentence, the share of the vocabulary seen fewer than 10 times in the text, and how the ten
commonest space-separated words are cut; then one JSON line.
"""

import argparse
import collections
import json
import os
import tempfile

import sentencepiece as spm

from data_pipeline.corpora import iterate_sentences
from data_pipeline.tokenizer import train_sentencepiece

MODEL_TYPES = ("unigram", "bpe")


def segmentation_stats(model_path, lines, common_words):
  """Pieces per sentence, rare-piece share of the vocabulary, and the common words' pieces."""
  processor = spm.SentencePieceProcessor(model_file=model_path)
  encoded = processor.encode(lines)
  counts = collections.Counter(piece for ids in encoded for piece in ids)
  vocabulary = processor.get_piece_size()
  return {
      "pieces_per_sentence": round(sum(map(len, encoded)) / len(encoded), 2),
      "vocabulary": vocabulary,
      "pieces_seen_under_10_times": round(
          sum(1 for i in range(vocabulary) if counts[i] < 10) / vocabulary, 3),
      "common_words": {word: processor.encode(word, out_type=str) for word in common_words},
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--text", required=True, help="one side of a training corpus")
  parser.add_argument("--vocab_size", type=int, default=8000)
  args = parser.parse_args()

  lines = list(iterate_sentences([args.text]))  # what a subword model is trained on
  words = collections.Counter(word for line in lines for word in line.split())
  common_words = [word for word, _ in words.most_common(10)]
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    for model_type in MODEL_TYPES:
      model_path = os.path.join(tmp, f"{model_type}.model")
      train_sentencepiece(lines, model_path, args.vocab_size, model_type)
      results[model_type] = segmentation_stats(model_path, lines, common_words)
  for model_type, stats in results.items():
    print(f"{model_type:8s} {stats['pieces_per_sentence']:6.2f} pieces a sentence, "
          f"{stats['pieces_seen_under_10_times']:.1%} of {stats['vocabulary']} pieces seen under "
          f"10 times")
    print("         " + "  ".join(f"{w}={'+'.join(p)}" for w, p in stats["common_words"].items()))
  print(json.dumps({"text": os.path.basename(args.text), "vocab_size": args.vocab_size,
                    **results}, ensure_ascii=False))


if __name__ == "__main__":
  main()
