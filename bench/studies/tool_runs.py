"""What the studies share: running a tool of the project and reading its last JSON line, reading
and writing line files, a data folder of Multi30k's sets, and the finished rows of a study kept
so that it can stop and go on."""

import gzip
import json
import os
import subprocess
import sys
import time


def run_tool(*args) -> tuple[dict, float]:
  """Runs `python -m args...`, its stderr passed through; returns (its last JSON line, or {}
  for a tool that prints none, and the seconds). A failing tool ends the study with one line
  naming it."""
  start = time.monotonic()
  result = subprocess.run([sys.executable, "-m", *args], stdout=subprocess.PIPE, text=True)
  seconds = time.monotonic() - start
  if result.returncode != 0:
    sys.exit(f"error: {' '.join(args[:1])} exited with {result.returncode}")
  lines = result.stdout.strip().splitlines()
  return (json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}), seconds


def final_dev_bleu(results: dict) -> float:
  """Dev BLEU of a training run's final weights (train's last JSON line)."""
  return round(results.get(f"dev_bleu_{results.get('final_weights')}", results["best_dev_bleu"]), 2)


def train_en_de(preset: str, data: str, model_dir: str, steps: int, *flags) -> dict:
  """A run of an En->De `preset` on `data` (a multi30k_folder), dev on val; its figures (dev
  BLEU of its final weights, minutes). The run decodes no test set: a test score comes from
  `evaluate_en_de`, once."""
  results, seconds = run_tool("tf_transformer.train", f"--flagfile={preset}", "--src_lang=en",
                              "--tgt_lang=de", f"--data_dir={data}", f"--model_dir={model_dir}",
                              "--dev_prefix=val", "--test_prefix=", f"--train_steps={steps}",
                              *flags)
  return {"dev": final_dev_bleu(results), "final_weights": results.get("final_weights"),
          "minutes": round(seconds / 60, 1), "steps": steps}


def evaluate_en_de(preset: str, data: str, split: str, output: str, *model) -> float:
  """sacreBLEU of `model` (--model_dir=... or --ensemble=...) on `split` of `data`, its
  translations written to `output`."""
  results, _ = run_tool("tf_transformer.bin.evaluate", f"--flagfile={preset}", "--src_lang=en",
                        "--tgt_lang=de", *model, f"--src={os.path.join(data, f'{split}.en.gz')}",
                        f"--ref={os.path.join(data, f'{split}.de.gz')}", f"--output={output}")
  return round(results["bleu"], 2)


def read_lines(path: str) -> list[str]:
  """The lines of a text file (plain or .gz), empty ones kept."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    text = f.read()
  lines = text.split("\n")
  return lines[:-1] if text.endswith("\n") else lines


def write_lines(path: str, lines: list[str]):
  """Writes `lines`, each stripped, one a line."""
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(line.strip() + "\n" for line in lines)


def multi30k_folder(folder: str, multi30k: str, train: dict[str, list[str]]):
  """A data folder: `train` ({lang: lines}) as train.{en,de}, Multi30k's val and
  test_2016_flickr (of the folder `multi30k`) linked beside it."""
  os.makedirs(folder, exist_ok=True)
  for lang, lines in train.items():
    write_lines(os.path.join(folder, f"train.{lang}"), lines)
  for split in ("val", "test_2016_flickr"):
    for lang in ("en", "de"):
      link = os.path.join(folder, f"{split}.{lang}.gz")
      if not os.path.exists(link):
        os.symlink(os.path.abspath(os.path.join(multi30k, f"{split}.{lang}.gz")), link)


def write_data(multi30k: str, folder: str, pairs: int) -> list[str]:
  """`folder`: Multi30k's train (its first `pairs`; 0: all), val and test_2016_flickr; returns
  the training sources."""
  train = {lang: read_lines(os.path.join(multi30k, f"train.{lang}.gz")) for lang in ("en", "de")}
  if len(train["en"]) != len(train["de"]):
    sys.exit(f"error: {multi30k}: train.en.gz and train.de.gz differ in length")
  multi30k_folder(folder, multi30k, {lang: lines[:pairs] if pairs else lines
                                     for lang, lines in train.items()})
  return read_lines(os.path.join(folder, "train.en"))


class Rows:
  """The study's finished rows, kept in `folder`/rows.json with the settings they were made
  with, so that the study run again with the same settings goes on from where it stopped."""

  def __init__(self, folder: str, settings: dict):
    self.path = os.path.join(folder, "rows.json")
    self.settings, self.rows = settings, {}
    if os.path.exists(self.path):
      with open(self.path, encoding="utf-8") as f:
        kept = json.load(f)
      if kept["settings"] != settings:
        sys.exit(f"error: {self.path}: a study with other settings ({kept['settings']}); "
                 "give another --out")
      self.rows = kept["rows"]

  def get(self, name: str, make):
    """The row `name`: kept, or made now by `make()` and kept."""
    if name not in self.rows:
      self.rows[name] = make()
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
      with open(self.path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"settings": self.settings, "rows": self.rows}, f, indent=1)
      os.replace(self.path + ".tmp", self.path)
    return self.rows[name]
