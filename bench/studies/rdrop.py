"""R-Drop on Multi30k En->De (Liang et al., 2021): the preset trained with each weight of
--alphas in its own steps, then with the weight best on val at --long_steps (R-Drop is known to
need longer training).

    python -m bench.studies.rdrop --multi30k=data/multi30k --out=runs/rdrop --alphas=1,5

(A smoke run of the plumbing, 3 minutes: --preset=F --pairs=300 --steps=20 --long_steps=40, F a
flagfile of `--flagfile=flags/tiny.cfg` and `--vocab_size=400`.)

Each run's final weights are chosen on val by the run (flags/multi30k_en_de.cfg's moving
average among them); the weight for the long run is chosen by val alone, and every row is
scored once on test_2016_flickr by `evaluate` (beam 4, sacreBLEU), its translations kept in
--out for the literature's scale (`../shared/tools/literature_bleu.sh`). Minutes are each
training's, alone on the machine. Finished rows are kept in --out's rows.json: the same command
run again goes on where it stopped (stop it between rows). The last line is JSON.
"""

import argparse
import json
import os

from bench.studies.tool_runs import Rows, evaluate_en_de, train_en_de, write_data

PRESET = "flags/multi30k_en_de.cfg"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--multi30k", required=True,
                      help="Multi30k's folder ({train,val,test_2016_flickr}.{en,de}.gz).")
  parser.add_argument("--out", required=True, help="A folder for the data and the runs.")
  parser.add_argument("--alphas", default="1,5", help="The R-Drop weights, comma-separated.")
  parser.add_argument("--steps", type=int, default=3000, help="The preset's steps.")
  parser.add_argument("--long_steps", type=int, default=6000,
                      help="The long run's steps (0: none).")
  parser.add_argument("--preset", default=PRESET, help="Another flagfile (a smoke run).")
  parser.add_argument("--pairs", type=int, default=0,
                      help="Only Multi30k's first this many training pairs (0: all; a smoke run).")
  args = parser.parse_args()

  data = os.path.join(args.out, "data")
  write_data(args.multi30k, data, args.pairs)
  kept = Rows(args.out, {key: value for key, value in vars(args).items() if key != "out"})

  def row(alpha: str, steps: int) -> dict:
    name = f"alpha_{alpha}_steps_{steps}"
    figures = dict(kept.get(name, lambda: train_en_de(
        args.preset, data, os.path.join(args.out, name), steps, "--train_prefix=train",
        f"--rdrop_alpha={alpha}")))
    figures["test"] = kept.get(f"{name}_test", lambda: evaluate_en_de(
        args.preset, data, "test_2016_flickr",
        os.path.join(args.out, f"{name}.test_2016_flickr.de"),
        f"--model_dir={os.path.join(args.out, name)}"))
    return {"alpha": float(alpha), **figures}

  rows = [row(alpha, args.steps) for alpha in args.alphas.split(",") if alpha]
  if args.long_steps:
    best = max(rows, key=lambda figures: figures["dev"])  # chosen by val alone
    rows.append(row(f"{best['alpha']:g}", args.long_steps))

  print("| En->De model | steps | minutes | val | test_2016_flickr |")
  print("|---|---|---|---|---|")
  for figures in rows:
    print(f"| --rdrop_alpha={figures['alpha']:g} | {figures['steps']} | {figures['minutes']} | "
          f"{figures['dev']} | {figures['test']} |")
  print(json.dumps({"rows": rows}))


if __name__ == "__main__":
  main()
