"""Runs benchmark commands alternately, round after round, and reports ratios of medians.

    python -m bench.alternate --rounds 3 --metric tgt_tok_per_s \\
        --a ".venv/bin/python -m bench.train_speed --flagfile=flags/small.cfg" \\
        --a ".venv/bin/python -m bench.train_speed --flagfile=flags/small.cfg --noskip_padding" \\
        --b "/tmp/peerenv/bin/python ../shared/bench/peers/torch_train.py --batching bucketed --json"

Each round runs every --a command (ours; one or more), then every --b (the peers; one or more,
e.g. PyTorch in float32 and under bfloat16 autocast). Each command must end its output with one
JSON line holding --metric (and, if present, peak_rss_mib). Every --a gets the ratio of its
median over each peer's median and its per-round ratios. On a shared, noisy machine only such
back-to-back ratios mean much.
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
  parser.add_argument("--a", required=True, action="append", help="our command (repeatable)")
  parser.add_argument("--b", required=True, action="append", help="a peer's command (repeatable)")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--metric", default="tgt_tok_per_s")
  args = parser.parse_args()
  commands = args.a + args.b
  values = {command: [] for command in commands}
  rss = {command: [] for command in commands}
  for round_ in range(args.rounds):
    for command in commands:
      result = subprocess.run(shlex.split(command), capture_output=True, text=True)
      if result.returncode:
        raise SystemExit(f"{command} failed:\n{result.stderr[-2000:]}")
      report = last_json(result.stdout)
      values[command].append(report[args.metric])
      rss[command].append(report.get("peak_rss_mib"))
      print(f"round {round_ + 1}: {args.metric} {report[args.metric]:.1f}, peak RSS "
            f"{report.get('peak_rss_mib') or float('nan'):.0f} MiB  <- {command}", flush=True)
  peers = [{"command": peer, "values": values[peer], "median": statistics.median(values[peer]),
            "peak_rss_mib": max((r for r in rss[peer] if r), default=None)} for peer in args.b]
  summary = {"metric": args.metric, "peers": peers,
             "ours": [{"command": command, "values": values[command],
                       "median": statistics.median(values[command]),
                       "peak_rss_mib": max((r for r in rss[command] if r), default=None),
                       "ratios": [{"peer": peer["command"],
                                   "of_medians": statistics.median(values[command])
                                                 / peer["median"],
                                   "per_round": [ours / theirs for ours, theirs in
                                                 zip(values[command], peer["values"])]}
                                  for peer in peers]}
                      for command in args.a]}
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
