"""The evaluate command: every metric, one-line errors."""

import json

from tests import testutil


def evaluate(model_dir, *args):
  """Runs the evaluate CLI over the model directory."""
  return testutil.run_cli("tf_transformer.evaluate", "--flagfile=flags/tiny.cfg",
                          f"--model_dir={model_dir}", "--beam_size=2", "--extra_decode_length=4",
                          *args)


def test_evaluate_reports_every_metric(tiny_model_dir, tmp_path):
  source = testutil.write_lines(tmp_path / "test.src.gz", ["aa bb", "cc dd", "ee"])
  reference = testutil.write_lines(tmp_path / "test.ref", ["bb aa", "dd cc", "ee"])
  result = evaluate(tiny_model_dir, f"--src={source}", f"--ref={reference}",
                    f"--output={tmp_path / 'hyp.txt'}")
  assert result.returncode == 0, result.stderr
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
  for key in ("bleu", "chrf", "bleu_1", "bleu_2", "bleu_3", "bleu_4"):
    assert 0.0 <= summary[key] <= 100.0
  assert summary["bleu_1"] >= summary["bleu_4"]
  assert len((tmp_path / "hyp.txt").read_text().splitlines()) == 3


def test_missing_reference_is_one_line_error(tiny_model_dir):
  testutil.assert_one_line_error(evaluate(tiny_model_dir, "--src=x"),
                                 "error: --src and --ref are both required")
