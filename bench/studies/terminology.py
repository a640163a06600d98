"""Terminology constraints on a test set: BLEU without and with terms from the references, and
the share of terms met (the README's terminology row).

    python -m bench.studies.terminology --model_dir=models/multi30k_en_de \\
        --src=data/multi30k/test_2016_flickr.en.gz --ref=data/multi30k/test_2016_flickr.de.gz \\
        --out=runs/terminology

The terms are chosen as Post & Vilar (2018) chose theirs, from each sentence's reference among what
the unconstrained translation lacks: the reference's words (runs of letters and digits, of two or
more, that the target vocabulary can write) missing from the translation's words. With a fixed seed
(--seed), each sentence with such words gets one or two terms (even odds); a term is one missing
word or, when the next reference word is missing too, the two as one phrase (even odds). A term is
met when the translation holds its words as whole words, in order. Both translations are beam
searches of the model's final weights (--beam_size), in batches of --batch_size; --out gets the
terms (translate --constraints's format) and both outputs. The last line is JSON.
"""

import gzip
import json
import os
import re

from absl import app, flags

flags.DEFINE_string("model_dir", None, "A trained model directory.", required=True)
flags.DEFINE_string("src", None, "Source sentences (.gz read too).", required=True)
flags.DEFINE_string("ref", None, "Their references (.gz read too).", required=True)
flags.DEFINE_string("out", None, "Where the terms and the outputs go.", required=True)
flags.DEFINE_integer("beam_size", 4, "Beam size of both translations.")
flags.DEFINE_integer("batch_size", 32, "Sentences a batch.")
flags.DEFINE_integer("seed", 1234, "The terms' random choices.")
FLAGS = flags.FLAGS

def _lines(path: str) -> list[str]:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f]


def words(text: str) -> list[str]:
  """The words of `text`: its runs of letters and digits ("Oregon-Schwimmer": two words)."""
  return re.findall(r"\w+", text)


def has_term(output: str, term: str) -> bool:
  """Whether `output` holds the words of `term` as whole words, in order."""
  have, wanted = words(output), term.split()
  return any(have[i:i + len(wanted)] == wanted for i in range(len(have) - len(wanted) + 1))


def choose_terms(reference: str, output: str, rng, writable) -> list[str]:
  """One or two terms of `reference` that `output` lacks (see the module's docstring), of the
  words that `writable(word)` is true of."""
  have = set(words(output))
  ref = words(reference)
  missing = [i for i, w in enumerate(ref) if w not in have and len(w) >= 2 and writable(w)]
  terms, used = [], set()
  for _ in range(int(rng.integers(1, 3))):
    free = [i for i in missing if i not in used and ref[i] not in terms]
    if not free:
      break
    i = int(rng.choice(free))
    phrase = (i + 1 in missing and i + 1 not in used and rng.random() < 0.5)
    used.update({i, i + 1} if phrase else {i})
    terms.append(" ".join(ref[i:i + 2]) if phrase else ref[i])
  return terms


def main(argv):
  import numpy as np

  import tf_transformer
  from data_pipeline import tokenizer
  from data_pipeline.token_ids import UNK_ID
  from tf_transformer.training import metrics
  from tf_transformer import model_dir as model_dir_lib

  sources, references = _lines(FLAGS.src), _lines(FLAGS.ref)
  model = tf_transformer.load(FLAGS.model_dir, beam_size=FLAGS.beam_size)
  plain = model.translate(sources, batch_size=FLAGS.batch_size)
  rng = np.random.default_rng(FLAGS.seed)
  # a word with a character the target vocabulary lacks cannot be written: not a term
  data = model_dir_lib.read_data(FLAGS.model_dir)
  target = tokenizer.load_vocabulary(*tokenizer.vocabulary_paths(
      FLAGS.model_dir, data["shared_vocab"], data["src_lang"], data["tgt_lang"])).target
  writable = lambda word: UNK_ID not in target.tokenize([word]).flat_values.numpy()
  terms = [choose_terms(r, o, rng, writable) for r, o in zip(references, plain)]
  constrained = model.translate(sources, constraints=terms, batch_size=FLAGS.batch_size)
  os.makedirs(FLAGS.out, exist_ok=True)
  for name, lines in (("terms.txt", ["\t".join(t) for t in terms]), ("plain.txt", plain),
                      ("constrained.txt", constrained)):
    with open(os.path.join(FLAGS.out, name), "w", encoding="utf-8") as f:
      f.writelines(line + "\n" for line in lines)
  all_terms = [(output, term) for output, ts in zip(constrained, terms) for term in ts]
  met = sum(has_term(output, term) for output, term in all_terms)
  report = {
      "sentences": len(sources), "constrained_sentences": sum(bool(t) for t in terms),
      "terms": len(all_terms), "phrases": sum(" " in term for _, term in all_terms),
      "terms_met": met, "share_met": met / max(len(all_terms), 1),
      "bleu_plain": metrics.corpus_bleu(plain, references)[0].score,
      "bleu_constrained": metrics.corpus_bleu(constrained, references)[0].score,
      "chrf_plain": metrics.corpus_chrf(plain, references)[0].score,
      "chrf_constrained": metrics.corpus_chrf(constrained, references)[0].score,
      "beam_size": FLAGS.beam_size, "seed": FLAGS.seed}
  for key, value in report.items():
    print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
  print(json.dumps(report))


if __name__ == "__main__":
  app.run(main)
