"""What the studies share: running a tool of the project and reading its last JSON line."""

import json
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
