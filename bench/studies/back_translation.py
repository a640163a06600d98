"""Back-translation on Multi30k, by beam search and by sampling: the README's back-translation rows.

    python -m bench.studies.back_translation --multi30k=data/multi30k --out=runs/bt \\
        [--train_steps=3000]

(A smoke run of the plumbing: --presets=F,F --half_pairs=500 --train_steps=20, F a flagfile of
`--flagfile=flags/tiny.cfg` and `--vocab_size=1000`: each run takes it with its direction's
languages.)

Multi30k's 29,000 training pairs are split in two halves by a fixed permutation (--seed): half A
is the parallel data; of half B only the German is read, as the "monolingual" text. Four runs,
each of the preset's model (flags/multi30k_en_de.cfg, flags/multi30k_de_en.cfg) for the same
--train_steps, their final weights chosen on val by the run:
  de_en     De->En on A: the back-translation model;
  baseline  En->De on A;
  bt_beam   En->De on A + (B's German, its translation by de_en with beam 4 as the source);
  bt_sample En->De on A + (B's German, a random sample of de_en's distribution as the source:
            --strategy=sample, the whole distribution at temperature 1, as Edunov et al. (2018)
            found best).
Each En->De run is scored on val (the choice of its weights) and once on test_2016_flickr by
`evaluate` (beam 4, sacreBLEU). Every run's minutes are reported. The last line is JSON.
"""

import argparse
import json
import os
import random
import sys

from bench.studies.tool_runs import (final_dev_bleu, multi30k_folder, read_lines, run_tool,
                                      write_lines)

PRESETS = {"en_de": "flags/multi30k_en_de.cfg", "de_en": "flags/multi30k_de_en.cfg"}
LANGUAGES = {"en_de": ("--src_lang=en", "--tgt_lang=de"), "de_en": ("--src_lang=de",
                                                                      "--tgt_lang=en")}


def split_halves(multi30k: str, seed: int, pairs: int = 0) -> tuple[dict, dict]:
  """({lang: lines} of half A, of half B): Multi30k's training pairs in a fixed random order
  (`pairs`: only the first that many of each half; 0: all)."""
  sides = {lang: read_lines(os.path.join(multi30k, f"train.{lang}.gz")) for lang in ("en", "de")}
  if len(sides["en"]) != len(sides["de"]):
    sys.exit(f"error: {multi30k}: train.en.gz and train.de.gz differ in length")
  order = list(range(len(sides["en"])))
  random.Random(seed).shuffle(order)
  half = len(order) // 2
  a, b = order[:half], order[half:]
  if pairs:
    a, b = a[:pairs], b[:pairs]
  return ({lang: [lines[i] for i in a] for lang, lines in sides.items()},
          {lang: [lines[i] for i in b] for lang, lines in sides.items()})


def train(direction: str, data: str, model_dir: str, steps: int, *flags) -> dict:
  """A run of `direction`'s preset on `data`; returns its figures (dev BLEU, minutes). No test
  set is decoded by the run: the table's test scores come from `evaluate`, once."""
  results, seconds = run_tool("tf_transformer.train", f"--flagfile={PRESETS[direction]}",
                              *LANGUAGES[direction], f"--data_dir={data}",
                              f"--model_dir={model_dir}", "--train_prefix=train",
                              "--dev_prefix=val", "--test_prefix=", f"--train_steps={steps}",
                              *flags)
  return {"dev": final_dev_bleu(results), "final_weights": results.get("final_weights"),
          "minutes": round(seconds / 60, 1), "steps": steps}


def back_translate(model_dir: str, german: str, output: str, *flags) -> float:
  """`german` (a file) translated into English by the De->En run; returns the minutes."""
  _, seconds = run_tool("tf_transformer.bin.translate", f"--flagfile={PRESETS['de_en']}",
                        *LANGUAGES["de_en"], f"--model_dir={model_dir}", f"--input={german}",
                        f"--output={output}", *flags)
  return round(seconds / 60, 1)


def test_bleu(multi30k: str, model_dir: str, output: str) -> float:
  results, _ = run_tool("tf_transformer.bin.evaluate", f"--flagfile={PRESETS['en_de']}",
                        *LANGUAGES["en_de"], f"--model_dir={model_dir}",
                        f"--src={os.path.join(multi30k, 'test_2016_flickr.en.gz')}",
                        f"--ref={os.path.join(multi30k, 'test_2016_flickr.de.gz')}",
                        f"--output={output}")
  return round(results["bleu"], 2)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--multi30k", required=True,
                      help="Multi30k's folder ({train,val,test_2016_flickr}.{en,de}.gz).")
  parser.add_argument("--out", required=True, help="A folder for the data and the four runs.")
  parser.add_argument("--train_steps", type=int, default=3000,
                      help="Every run's budget (the presets' own by default).")
  parser.add_argument("--seed", type=int, default=1, help="The split's and the samples' seed.")
  parser.add_argument("--presets", default="",
                      help="EN_DE,DE_EN flagfiles instead of the Multi30k presets (a smoke run).")
  parser.add_argument("--half_pairs", type=int, default=0,
                      help="Only this many pairs of each half (0: all; a smoke run).")
  args = parser.parse_args()
  if args.presets:
    PRESETS.update(zip(("en_de", "de_en"), args.presets.split(",")))

  half_a, half_b = split_halves(args.multi30k, args.seed, args.half_pairs)
  german = os.path.join(args.out, "monolingual.de")
  os.makedirs(args.out, exist_ok=True)
  write_lines(german, half_b["de"])  # half B's English is never read
  multi30k_folder(os.path.join(args.out, "half_a"), args.multi30k, half_a)
  rows, steps = {}, args.train_steps

  de_en = os.path.join(args.out, "de_en")
  rows["de_en"] = train("de_en", os.path.join(args.out, "half_a"), de_en, steps)
  rows["baseline"] = train("en_de", os.path.join(args.out, "half_a"),
                           os.path.join(args.out, "baseline"), steps)
  for name, flags in (("bt_beam", ("--beam_size=4",)),
                      ("bt_sample", ("--strategy=sample", f"--seed={args.seed}"))):
    synthetic = os.path.join(args.out, f"{name}.en")
    minutes = back_translate(de_en, german, synthetic, *flags)
    data = os.path.join(args.out, name)
    multi30k_folder(data, args.multi30k, {"en": half_a["en"] + read_lines(synthetic),
                                  "de": half_a["de"] + half_b["de"]})
    rows[name] = {**train("en_de", data, os.path.join(args.out, f"{name}_model"), steps),
                  "back_translation_minutes": minutes}
  for name in ("baseline", "bt_beam", "bt_sample"):
    model_dir = os.path.join(args.out, "baseline" if name == "baseline" else f"{name}_model")
    rows[name]["test"] = test_bleu(args.multi30k, model_dir,
                                   os.path.join(args.out, f"{name}.test_2016_flickr.de"))

  print("| En->De model | training pairs | minutes, steps | val | test_2016_flickr |")
  print("|---|---|---|---|---|")
  for name, pairs in (("baseline", len(half_a["en"])),
                      ("bt_beam", len(half_a["en"]) + len(half_b["de"])),
                      ("bt_sample", len(half_a["en"]) + len(half_b["de"]))):
    row = rows[name]
    print(f"| {name} | {pairs:,} | {row['minutes']} min, {row['steps']} | {row['dev']} | "
          f"{row['test']} |")
  print(json.dumps({"half_pairs": len(half_a["en"]), **rows}))


if __name__ == "__main__":
  main()
