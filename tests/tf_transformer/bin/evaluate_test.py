"""The evaluate command: every metric, one-line errors."""

import json
import shutil

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


def test_a_cut_source_is_named_by_its_line(tiny_model_dir, tmp_path):
  long = " ".join(["aa", "bb"] * 20)  # 40 pieces, over tiny.cfg's --max_length=32
  source = testutil.write_lines(tmp_path / "test.src", ["aa bb", long, "ee"])
  result = evaluate(tiny_model_dir, f"--src={source}", f"--ref={source}",
                    f"--output={tmp_path / 'hyp.txt'}")
  assert result.returncode == 0, result.stderr
  assert (f"warning: {source}: line 2 was cut at --max_length=32 subword pieces: the answer is "
          "that of the first pieces") in result.stderr.splitlines()


def test_evaluate_ensemble_loads_each_member_at_checkpoint(tiny_model_dir, other_tiny_model_dir,
                                                           tmp_path):
  """Members whose latest checkpoint holds tiny_model_dir's weights and whose `average` holds
  other_tiny_model_dir's: --ensemble of two such members at --checkpoint=average translates as
  other_tiny_model_dir alone (a model ensembled with itself decodes as the model)."""
  import keras
  import tensorflow as tf

  from tf_transformer import model_dir as model_dir_lib
  from tf_transformer.model import build_model

  member = tmp_path / "member"
  shutil.copytree(tiny_model_dir, member)
  keras.utils.set_random_seed(1)  # other_tiny_model_dir's weights
  weights = tf.train.Checkpoint(model=build_model(model_dir_lib.read_config(str(member))))
  tf.train.CheckpointManager(weights, str(member / "average"), max_to_keep=1).save()
  source = testutil.write_lines(tmp_path / "test.src", ["aa bb", "cc dd ee", "ff gg", "hh"])
  hypotheses = {}
  for name, args in (("ensemble", ("--ensemble=" + f"{member},{member}", "--checkpoint=average")),
                     ("other", (f"--model_dir={other_tiny_model_dir}",)),
                     ("latest", (f"--model_dir={member}", "--checkpoint=latest"))):
    result = testutil.run_cli("tf_transformer.bin.evaluate", "--flagfile=flags/tiny.cfg",
                              "--beam_size=2", "--extra_decode_length=4", f"--src={source}",
                              f"--ref={source}", f"--output={tmp_path / name}", *args)
    assert result.returncode == 0, result.stderr
    hypotheses[name] = (tmp_path / name).read_text()
  assert hypotheses["ensemble"] == hypotheses["other"] != hypotheses["latest"]


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
