"""Sequence-level knowledge distillation on Multi30k En->De (Kim & Rush, 2016): one student as
good as its teachers' ensemble.

    python -m bench.studies.distillation --multi30k=data/multi30k --out=runs/kd \\
        --teachers=models/multi30k_en_de,models/multi30k_en_de_seed2 [--teacher_minutes=M]
    python -m bench.studies.distillation --multi30k=data/multi30k --out=runs/kd \\
        --teacher_seeds=1234,2     # trains the two teachers here first

(A smoke run of the plumbing, 8 minutes: --preset=F --pairs=500 --train_steps=150
--teacher_seeds=1,2, F a flagfile of `--flagfile=flags/tiny.cfg` and `--vocab_size=600`.)

The teachers are the preset's models (flags/multi30k_en_de.cfg): model directories given with
--teachers (their training minutes, if known, with --teacher_minutes), or trained here with each
seed of --teacher_seeds (the first one's subword model copied into the others' directories, as an
ensemble needs one vocabulary). Their ensemble (`translate --ensemble`: log-probabilities
averaged each step, beam 4) translates Multi30k's training sources; the distilled corpus is those
sources with the ensemble's translations (distilled.{en,de}), beside Multi30k's own
train.{en,de}.

Students, each of the preset's size and steps (--train_steps), their final weights chosen on
val by the run, with --student_flags added to each (say --rdrop_alpha=A for a combined row):
  distilled  on the distilled pairs alone;
  mixed      on Multi30k's pairs and the distilled ones, half each
             (`--train_prefix=train,distilled --train_weights=1,1`).
The teachers' ensemble and each student are scored on val and once on test_2016_flickr by
`evaluate` (beam 4, sacreBLEU); nothing is chosen by a test score. Each row's minutes are its
own and, in "all minutes", the teachers' and the distillation's too: the CPU time the student
cost in all. Run it alone on the machine. The last line is JSON.

Each finished row (a teacher, the distillation, a student, a score) is kept in --out's
rows.json as it ends: the same command run again, after a stop, takes up where the study stopped
with the minutes already measured. A training stopped half-way resumes from its last checkpoint,
and its row then counts the minutes of the rerun alone: stop the study between rows.
"""

import argparse
import json
import os
import shutil
import sys

from bench.studies.tool_runs import (Rows, evaluate_en_de, run_tool, train_en_de, write_data,
                                      write_lines)

PRESET = "flags/multi30k_en_de.cfg"
LANGUAGES = ("--src_lang=en", "--tgt_lang=de")
STUDENTS = {"distilled": ("--train_prefix=distilled",),
            "mixed": ("--train_prefix=train,distilled", "--train_weights=1,1")}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--multi30k", required=True,
                      help="Multi30k's folder ({train,val,test_2016_flickr}.{en,de}.gz).")
  parser.add_argument("--out", required=True, help="A folder for the data and the runs.")
  parser.add_argument("--teachers", default="",
                      help="The teachers' model directories, comma-separated.")
  parser.add_argument("--teacher_minutes", type=float, default=0.0,
                      help="With --teachers: the minutes their training took in all.")
  parser.add_argument("--teacher_seeds", default="",
                      help="Instead of --teachers: train a teacher here with each seed.")
  parser.add_argument("--train_steps", type=int, default=3000,
                      help="Each student's (and each teacher's trained here) budget.")
  parser.add_argument("--students", default="distilled,mixed",
                      help=f"The students to train, of {', '.join(STUDENTS)}.")
  parser.add_argument("--student_flags", default="",
                      help="Flags added to every student's training (space-separated).")
  parser.add_argument("--preset", default="", help="A flagfile instead of the preset (a smoke "
                      "run).")
  parser.add_argument("--pairs", type=int, default=0,
                      help="Only Multi30k's first this many training pairs (0: all; a smoke run).")
  args = parser.parse_args()
  global PRESET
  PRESET = args.preset or PRESET
  if bool(args.teachers) == bool(args.teacher_seeds):
    sys.exit("error: give --teachers or --teacher_seeds (one of them)")
  students = [name for name in args.students.split(",") if name]
  if not students or any(name not in STUDENTS for name in students):
    sys.exit(f"error: --students={args.students}: choose among {', '.join(STUDENTS)}")

  data = os.path.join(args.out, "data")
  sources = write_data(args.multi30k, data, args.pairs)
  kept = Rows(args.out, {key: value for key, value in vars(args).items() if key != "out"})
  rows, teacher_minutes = {}, args.teacher_minutes
  teachers = [path for path in args.teachers.split(",") if path]
  for seed in [seed for seed in args.teacher_seeds.split(",") if seed]:
    teachers.append(os.path.join(args.out, f"teacher_{seed}"))
    if len(teachers) > 1:  # an ensemble's members share one vocabulary: the first one's
      os.makedirs(teachers[-1], exist_ok=True)
      for name in os.listdir(teachers[0]):
        if name.startswith("spm.") and name.endswith(".model"):
          shutil.copy(os.path.join(teachers[0], name), teachers[-1])
    rows[f"teacher_{seed}"] = kept.get(f"teacher_{seed}", lambda: train_en_de(
        PRESET, data, teachers[-1], args.train_steps, "--train_prefix=train", f"--seed={seed}"))
    teacher_minutes += rows[f"teacher_{seed}"]["minutes"]
  ensemble = f"--ensemble={','.join(teachers)}"

  def distill() -> dict:
    """The distilled targets: the ensemble's beam-4 translations of the training sources."""
    write_lines(os.path.join(data, "distilled.en"), sources)
    _, seconds = run_tool("tf_transformer.bin.translate", f"--flagfile={PRESET}", *LANGUAGES,
                          ensemble, f"--input={os.path.join(data, 'distilled.en')}",
                          f"--output={os.path.join(data, 'distilled.de')}")
    return {"minutes": round(seconds / 60, 1)}

  distillation_minutes = kept.get("distillation", distill)["minutes"]
  rows["ensemble"] = {"minutes": round(teacher_minutes, 1),
                      "dev": kept.get("ensemble_dev", lambda: evaluate_en_de(
                          PRESET, data, "val", os.path.join(args.out, "ensemble.val.de"),
                          ensemble))}
  for name in students:
    row = dict(kept.get(name, lambda: train_en_de(
        PRESET, data, os.path.join(args.out, name), args.train_steps, *STUDENTS[name],
        *args.student_flags.split())))
    row["all_minutes"] = round(teacher_minutes + distillation_minutes + row["minutes"], 1)
    rows[name] = row
  for name in ["ensemble", *students]:
    model = ensemble if name == "ensemble" else f"--model_dir={os.path.join(args.out, name)}"
    rows[name]["test"] = kept.get(f"{name}_test", lambda: evaluate_en_de(
        PRESET, data, "test_2016_flickr", os.path.join(args.out, f"{name}.test_2016_flickr.de"),
        model))

  print("| En->De model | training pairs | minutes (all) | val | test_2016_flickr |")
  print("|---|---|---|---|---|")
  print(f"| teachers' ensemble ({len(teachers)}) | {len(sources):,} | "
        f"{rows['ensemble']['minutes']} | {rows['ensemble']['dev']} | "
        f"{rows['ensemble']['test']} |")
  for name in students:
    row = rows[name]
    pairs = len(sources) * (2 if name == "mixed" else 1)
    print(f"| {name} {args.student_flags} | {pairs:,} | {row['minutes']} ({row['all_minutes']}) "
          f"| {row['dev']} | {row['test']} |")
  print(json.dumps({"pairs": len(sources), "distillation_minutes": distillation_minutes,
                    "student_flags": args.student_flags, **rows}))


if __name__ == "__main__":
  main()
