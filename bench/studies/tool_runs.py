"""What the studies share: running a tool of the project and reading its last JSON line, reading
and writing line files, and a data folder of Multi30k's sets."""

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
