"""Fine-tuning a caption model on TED talks: the README's fine-tuning table.

    python -m bench.studies.ted_fine_tuning --init_from=models/multi30k_en_de --out=runs/ted \\
        --ted=../shared/data/iwslt17_en_de --flickr=../shared/data/multi30k --train_steps=400

The IWSLT'17 En-De text that is here has no training split, so the study splits it by year:
  train  tst2010-2015 (the Hugging Face "test" split of iwslt2017-de-en, 8,079 pairs)
  dev    dev2010 (888 pairs): the only set any choice is made on
  test   tst2017 (WIT3 XML, 1,138 pairs), scored once per model
Rows: the caption model on tst2017 as it is; the caption model fine-tuned (`train --init_from`)
for --train_steps steps; a model of the same size trained from scratch on the same pairs for the
same steps (its own subword model, a warm-up of a third of the steps); and both the caption model
and the fine-tuned one on the captions' test_2016_flickr (what fine-tuning forgot). Every model is
scored by `evaluate` with its final weights (chosen on dev by the run), beam 4. The last line is
JSON.
"""

import argparse
import gzip
import json
import os
import sys

from bench.studies.tool_runs import final_dev_bleu, run_tool
from data_pipeline import wit3


def _lines(path):
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return f.read().split("\n")


def write_ted(ted, folder):
  """Writes {train,val,test}.{en,de} of the year split above into `folder`; returns line counts."""
  os.makedirs(folder, exist_ok=True)
  splits = {
      "train": {lang: _lines(os.path.join(ted, "hf_txt", f"test-{lang}.txt.gz"))
                for lang in ("en", "de")},
      "val": {lang: _lines(os.path.join(ted, "hf_txt", f"valid-{lang}.txt.gz"))
              for lang in ("en", "de")},
  }
  test = {}
  for lang, pair in (("en", "en-de"), ("de", "de-en")):
    with gzip.open(os.path.join(ted, "xml", f"IWSLT17.TED.tst2017.{pair}.{lang}.xml.gz")) as f:
      test[lang] = wit3.convert(f.read(), "xml")
  wit3.check_aligned({"tst2017.en": test["en"], "tst2017.de": test["de"]})
  splits["test"] = {lang: [text for _, text in sentences] for lang, sentences in test.items()}
  counts = {}
  for split, sides in splits.items():
    if len(sides["en"]) != len(sides["de"]):
      sys.exit(f"error: {split}: {len(sides['en'])} English lines but {len(sides['de'])} German")
    counts[split] = len(sides["en"])
    for lang, lines in sides.items():
      with open(os.path.join(folder, f"{split}.{lang}"), "w", encoding="utf-8") as f:
        f.writelines(line.strip() + "\n" for line in lines)
  return counts


def evaluate(preset, model_dir, src, ref, output):
  results, _ = run_tool("tf_transformer.bin.evaluate", f"--flagfile={preset}",
                        f"--model_dir={model_dir}", "--src_lang=en", "--tgt_lang=de",
                        f"--src={src}", f"--ref={ref}", f"--output={output}")
  return round(results["bleu"], 2)


def train(preset, data, model_dir, steps, *flags):
  """A run on the TED split; returns (its results, seconds). The run decodes no test set
  (`--test_prefix=` clears the preset's): the table's scores all come from `evaluate`
  (float32), like the caption model's, and tst2017 is decoded once."""
  return run_tool("tf_transformer.train", f"--flagfile={preset}", f"--data_dir={data}",
                  f"--model_dir={model_dir}", "--dev_prefix=val", "--test_prefix=",
                  f"--train_steps={steps}", *flags)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--init_from", required=True, help="The caption model's directory.")
  parser.add_argument("--out", required=True, help="A folder for the data and the two runs.")
  parser.add_argument("--ted", required=True, help="The iwslt17_en_de folder (hf_txt/, xml/).")
  parser.add_argument("--flickr", required=True, help="The Multi30k folder (test_2016_flickr).")
  parser.add_argument("--preset", default="flags/multi30k_en_de.cfg")
  parser.add_argument("--train_steps", type=int, default=400)
  parser.add_argument("--warmup_steps", type=int, default=200, help="Fine-tuning's warm-up.")
  parser.add_argument("--learning_rate", type=float, default=0.25,
                      help="Fine-tuning's Noam scale (the preset's is 1.0 over 800 steps).")
  parser.add_argument("--eval_every", type=int, default=200)
  args = parser.parse_args()

  data = os.path.join(args.out, "ted")
  counts = write_ted(args.ted, data)
  print(f"TED pairs: {counts}", file=sys.stderr)
  flickr = [os.path.join(args.flickr, f"test_2016_flickr.{lang}.gz") for lang in ("en", "de")]
  test = [os.path.join(data, f"test.{lang}") for lang in ("en", "de")]
  every = (f"--eval_every={args.eval_every}", f"--save_every={args.eval_every}")

  rows = {"caption": {"tst2017": evaluate(args.preset, args.init_from, *test,
                                          os.path.join(args.out, "caption.tst2017.de")),
                      "flickr": evaluate(args.preset, args.init_from, *flickr,
                                         os.path.join(args.out, "caption.flickr.de"))}}

  fine_tuned = os.path.join(args.out, "fine_tuned")
  results, seconds = train(args.preset, data, fine_tuned, args.train_steps,
                           f"--init_from={args.init_from}", f"--warmup_steps={args.warmup_steps}",
                           f"--learning_rate={args.learning_rate}", *every)
  rows["fine_tuned"] = {
      "minutes": round(seconds / 60, 1), "steps": args.train_steps,
      "final_weights": results.get("final_weights"), "dev": final_dev_bleu(results),
      "tst2017": evaluate(args.preset, fine_tuned, *test,
                          os.path.join(args.out, "fine_tuned.tst2017.de")),
      "flickr": evaluate(args.preset, fine_tuned, *flickr,
                         os.path.join(args.out, "fine_tuned.flickr.de"))}

  scratch = os.path.join(args.out, "scratch")
  results, seconds = train(args.preset, data, scratch, args.train_steps,
                           f"--warmup_steps={max(1, args.train_steps // 3)}", *every)
  rows["scratch"] = {
      "minutes": round(seconds / 60, 1), "steps": args.train_steps,
      "final_weights": results.get("final_weights"), "dev": final_dev_bleu(results),
      "tst2017": evaluate(args.preset, scratch, *test,
                          os.path.join(args.out, "scratch.tst2017.de"))}

  print("| model | minutes, steps | TED dev2010 | TED tst2017 | test_2016_flickr |")
  print("|---|---|---|---|---|")
  print(f"| caption model as it is | - | - | {rows['caption']['tst2017']} | "
        f"{rows['caption']['flickr']} |")
  for name, label in (("fine_tuned", "fine-tuned on TED"), ("scratch", "from scratch on TED")):
    row = rows[name]
    print(f"| {label} | {row['minutes']} min, {row['steps']} | {row['dev']} | {row['tst2017']} | "
          f"{row.get('flickr', '-')} |")
  print(json.dumps({"pairs": counts, **rows}))


if __name__ == "__main__":
  main()
