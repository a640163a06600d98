"""Runs two benchmark commands alternately (A, B, A, B, ...) and reports the ratio of medians.

    python bench/alternate.py --rounds 3 --metric tgt_tok_per_s \\
        --a ".venv/bin/python bench/train_speed.py --flagfile=flags/small.cfg" \\
        --b "/tmp/peerenv/bin/python ../shared/bench/peers/torch_train.py --batching bucketed --json"

Each command must end its output with one JSON line holding --metric (and, if present,
peak_rss_mib). On a shared, noisy machine only such back-to-back ratios mean much.
"""

import argparse
import json
import shlex
import statistics
import subprocess


def last_json(output: str) -> dict:
  for line in reversed(output.strip().splitlines()):
    line = line.strip()
    if line.startswith("{"):
      return json.loads(line)
    if line.startswith("SUMMARY {"):
      return json.loads(line[len("SUMMARY "):])
  raise SystemExit(f"no JSON line in the output:\n{output[-2000:]}")


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--a", required=True, help="our command")
  parser.add_argument("--b", required=True, help="the peer's command")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--metric", default="tgt_tok_per_s")
  args = parser.parse_args()
  values = {"a": [], "b": []}
  rss = {"a": [], "b": []}
  for round_ in range(args.rounds):
    for side in ("a", "b"):
      result = subprocess.run(shlex.split(getattr(args, side)), capture_output=True, text=True)
      if result.returncode:
        raise SystemExit(f"{side} failed:\n{result.stderr[-2000:]}")
      report = last_json(result.stdout)
      values[side].append(report[args.metric])
      rss[side].append(report.get("peak_rss_mib"))
      print(f"round {round_ + 1} {side}: {args.metric} {report[args.metric]:.1f}, "
            f"peak RSS {report.get('peak_rss_mib') or float('nan'):.0f} MiB", flush=True)
  medians = {side: statistics.median(v) for side, v in values.items()}
  summary = {"metric": args.metric, "a": values["a"], "b": values["b"],
             "median_a": medians["a"], "median_b": medians["b"],
             "ratio_a_over_b": medians["a"] / medians["b"],
             "peak_rss_mib_a": max((r for r in rss["a"] if r), default=None),
             "peak_rss_mib_b": max((r for r in rss["b"] if r), default=None)}
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
