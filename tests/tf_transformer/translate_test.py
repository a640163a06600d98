"""The translate and evaluate commands: order, empty lines, n-best, metrics, one-line errors."""

import gzip
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINES = ["aa bb cc", "", "dd ee", "ff", "", "gg hh ii jj"]


def run(module, model_dir, *args, stdin=None):
  """Runs a CLI over the model directory (None: the arguments name the model)."""
  model = [f"--model_dir={model_dir}", "--beam_size=2"] if model_dir else []
  return subprocess.run(
      [sys.executable, "-m", f"tf_transformer.{module}", "--flagfile=flags/tiny.cfg", *model,
       "--extra_decode_length=4", *args],
      cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=300)


def test_translate_keeps_order_and_empty_lines(tiny_model_dir, tmp_path):
  source = tmp_path / "input.txt"
  source.write_text("\n".join(LINES) + "\n")
  from_file = run("translate", tiny_model_dir, f"--input={source}",
                  f"--output={tmp_path / 'out.txt'}")
  assert from_file.returncode == 0, from_file.stderr
  outputs = (tmp_path / "out.txt").read_text().split("\n")[:-1]
  assert len(outputs) == len(LINES)
  assert outputs[1] == "" and outputs[4] == "" and all(outputs[i] for i in (0, 2, 3, 5))
  # the same sentences through stdin, in another order, give the same translations
  shuffled = [LINES[i] for i in (5, 3, 2, 0)]
  piped = run("translate", tiny_model_dir, stdin="\n".join(shuffled) + "\n")
  assert piped.returncode == 0, piped.stderr
  assert piped.stdout.split("\n")[:-1] == [outputs[i] for i in (5, 3, 2, 0)]


def test_translate_nbest_is_sorted(tiny_model_dir):
  result = run("translate", tiny_model_dir, "--nbest=2", stdin="aa bb cc\ndd ee\n")
  assert result.returncode == 0, result.stderr
  rows = [line.split(" ||| ") for line in result.stdout.strip().split("\n")]
  assert [row[0] for row in rows] == ["0", "0", "1", "1"]
  for first, second in ((rows[0], rows[1]), (rows[2], rows[3])):
    assert float(first[2]) >= float(second[2])


def test_evaluate_reports_every_metric(tiny_model_dir, tmp_path):
  with gzip.open(tmp_path / "test.src.gz", "wt") as f:
    f.write("aa bb\ncc dd\nee\n")
  (tmp_path / "test.ref").write_text("bb aa\ndd cc\nee\n")
  result = run("evaluate", tiny_model_dir, f"--src={tmp_path / 'test.src.gz'}",
               f"--ref={tmp_path / 'test.ref'}", f"--output={tmp_path / 'hyp.txt'}")
  assert result.returncode == 0, result.stderr
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
  for key in ("bleu", "chrf", "bleu_1", "bleu_2", "bleu_3", "bleu_4"):
    assert 0.0 <= summary[key] <= 100.0
  assert summary["bleu_1"] >= summary["bleu_4"]
  assert len((tmp_path / "hyp.txt").read_text().splitlines()) == 3


def test_bad_inputs_are_one_line_errors(tiny_model_dir, tmp_path):
  (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\xfe broken\n")
  cases = [
      (run("translate", tiny_model_dir, f"--input={tmp_path / 'bad.txt'}"),
       f"error: {tmp_path / 'bad.txt'}:2: not valid UTF-8"),
      (run("translate", tmp_path / "missing"), f"error: {tmp_path / 'missing'}: no such directory"),
      (run("translate", tiny_model_dir, "--beam_size=0"),
       "error: --beam_size must be at least 1, got 0"),
      (run("evaluate", tiny_model_dir, "--src=x"), "error: --src and --ref are both required"),
      (run("translate", None, f"--saved_model={tmp_path}"),
       f"error: {tmp_path}: no saved_model.pb (give a version folder such as "
       "exports/<name>/<version>)"),
  ]
  for result, message in cases:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == message
