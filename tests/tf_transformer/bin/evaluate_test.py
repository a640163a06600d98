"""The evaluate command: every metric, one-line errors."""

import json

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU

from tests import testutil


def evaluate(model_dir, *args):
  """Runs the evaluate CLI over the model directory."""
  return testutil.run_cli("tf_transformer.bin.evaluate", "--flagfile=flags/tiny.cfg",
                          f"--model_dir={model_dir}", "--beam_size=2", "--extra_decode_length=4",
                          *args)


def test_evaluate_reports_every_metric(tiny_model_dir, tmp_path):
  source = testutil.write_lines(tmp_path / "test.src.gz", ["aa bb", "cc dd", "ee"])
  first = evaluate(tiny_model_dir, f"--src={source}", f"--ref={source}",
                   f"--output={tmp_path / 'hyp.txt'}")
  assert first.returncode == 0, first.stderr
  hypotheses = (tmp_path / "hyp.txt").read_text().splitlines()
  assert len(hypotheses) == 3 and all(hypotheses)
  # references: two are the model's own outputs, one is not; the scores must be sacrebleu's
  references = [hypotheses[0], hypotheses[1] + " extra words here", "something else entirely"]
  reference = testutil.write_lines(tmp_path / "test.ref", references)
  result = evaluate(tiny_model_dir, f"--src={source}", f"--ref={reference}",
                    f"--output={tmp_path / 'hyp2.txt'}")
  assert result.returncode == 0, result.stderr
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
  expected = {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
              "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}
  for n in range(1, 5):
    expected[f"bleu_{n}"] = BLEU(max_ngram_order=n).corpus_score(hypotheses,
                                                                 [references]).score
  for key, value in expected.items():
    assert summary[key] == pytest.approx(value, abs=1e-6), key
  assert 0 < summary["bleu"] < 100 and summary["bleu_1"] > summary["bleu_4"]

  # the outputs as their own references: every metric is 100
  own = evaluate(tiny_model_dir, f"--src={source}", f"--ref={tmp_path / 'hyp.txt'}",
                 f"--output={tmp_path / 'hyp3.txt'}")
  summary = json.loads(own.stdout.strip().splitlines()[-1])
  for key in ("bleu", "chrf", "bleu_1", "bleu_4"):
    assert summary[key] == pytest.approx(100.0), key


def test_missing_reference_is_one_line_error(tiny_model_dir):
  testutil.assert_one_line_error(evaluate(tiny_model_dir, "--src=x"),
                                 "error: --ref is required (see --helpfull)")


def test_evaluate_scores_random_samples_and_translate_draws_the_same(tiny_model_dir, tmp_path):
  """--strategy=sample: evaluate's hypotheses are translate's samples for the same --seed,
  in batches of one or line by line (a sentence's draws are its seed's and line number's);
  another seed draws others."""
  source = testutil.write_lines(tmp_path / "test.src", ["aa bb", "cc dd ee", "ff", "gg hh"])
  runs = {}
  for seed in (3, 4):
    result = evaluate(tiny_model_dir, f"--src={source}", f"--ref={source}", "--strategy=sample",
                      f"--seed={seed}", "--sampling_temperature=1.5",
                      f"--output={tmp_path / f'hyp{seed}.txt'}")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["strategy"] == "sample"
    runs[seed] = (tmp_path / f"hyp{seed}.txt").read_text().splitlines()
  for mode in ("--batch_size=1", "--stream"):  # (stream: each line a call of its own)
    translated = testutil.run_cli(
        "tf_transformer.bin.translate", "--flagfile=flags/tiny.cfg",
        f"--model_dir={tiny_model_dir}", "--extra_decode_length=4", "--strategy=sample",
        "--seed=3", "--sampling_temperature=1.5", f"--input={source}", mode)
    assert translated.returncode == 0, translated.stderr
    assert translated.stdout.splitlines() == runs[3], mode
  assert runs[3] != runs[4]
