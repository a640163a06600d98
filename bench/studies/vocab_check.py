"""How SentencePiece's unigram and BPE models segment one side of a corpus.

    python -m bench.studies.vocab_check --text=data/ja_vi_alt/train.vi \
        [--heldout=data/ja_vi_alt/dev.vi] [--vocab_size 8000] [--byte_fallback]

Trains both model types on the text (files, plain or .gz, one sentence a line; several,
comma-separated, as a joint model is trained on both sides) with the project's own trainer
(`data_pipeline.tokenizer.train_sentencepiece`), then prints for each: pieces per sentence, the
share of the vocabulary seen fewer than 10 times in the text, how the ten commonest
space-separated words are cut, and the <unk> pieces of the text and of the held-out text (the
characters the model keeps no piece for; none with --byte_fallback); then one JSON line.
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


def unknown_stats(processor, lines):
  """<unk> pieces per 1,000 pieces, the sentences holding one, and the ten characters most
  often behind one (the sentences they are in)."""
  encoded = processor.encode(lines)
  unknown = [ids.count(processor.unk_id()) for ids in encoded]
  characters = collections.Counter(
      character for line, count in zip(lines, unknown) if count for character in set(line)
      if processor.unk_id() in processor.encode(character))
  return {"unknown_per_1000_pieces": round(1000 * sum(unknown) / sum(map(len, encoded)), 2),
          "sentences_with_unknown": sum(1 for count in unknown if count),
          "sentences": len(lines),
          "characters_without_a_piece": "".join(c for c, _ in characters.most_common(10))}


def segmentation_stats(model_path, lines, common_words, heldout):
  """Pieces per sentence, rare-piece share of the vocabulary, the common words' pieces, and
  the <unk> pieces of `lines` and of `heldout` (which may be empty)."""
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
      "unknown": {"text": unknown_stats(processor, lines),
                  **({"heldout": unknown_stats(processor, heldout)} if heldout else {})},
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--text", required=True,
                      help="a training corpus's files, comma-separated: one side, or both")
  parser.add_argument("--heldout", default="", help="held-out files, comma-separated")
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--byte_fallback", action="store_true",
                      help="train the models with --spm_byte_fallback")
  args = parser.parse_args()

  lines = list(iterate_sentences(args.text.split(",")))  # what a subword model is trained on
  heldout = list(iterate_sentences(args.heldout.split(","))) if args.heldout else []
  words = collections.Counter(word for line in lines for word in line.split())
  common_words = [word for word, _ in words.most_common(10)]
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    for model_type in MODEL_TYPES:
      model_path = os.path.join(tmp, f"{model_type}.model")
      train_sentencepiece(lines, model_path, args.vocab_size, model_type,
                          byte_fallback=args.byte_fallback)
      results[model_type] = segmentation_stats(model_path, lines, common_words, heldout)
  for model_type, stats in results.items():
    print(f"{model_type:8s} {stats['pieces_per_sentence']:6.2f} pieces a sentence, "
          f"{stats['pieces_seen_under_10_times']:.1%} of {stats['vocabulary']} pieces seen under "
          f"10 times")
    print("         " + "  ".join(f"{w}={'+'.join(p)}" for w, p in stats["common_words"].items()))
    for name, unknown in stats["unknown"].items():
      print(f"         {name}: {unknown['unknown_per_1000_pieces']} <unk> a 1,000 pieces, in "
            f"{unknown['sentences_with_unknown']} of {unknown['sentences']} sentences "
            f"(characters: {unknown['characters_without_a_piece'] or 'none'})")
  print(json.dumps({"text": args.text, "heldout": args.heldout, "vocab_size": args.vocab_size,
                    "byte_fallback": args.byte_fallback, **results}, ensure_ascii=False))


if __name__ == "__main__":
  main()
