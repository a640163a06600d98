"""Tests for the build_dataset CLI: text files in, a TFDS dataset that training reads out."""

import json
import pathlib
import re

import numpy as np

from tests import testutil
from tests.tf_transformer.training.trainer_test import summaries


def write_split(folder, name, lines, offset=0):
  numbers = range(offset, offset + lines)
  return testutil.write_corpus(folder, name, [f"w{i % 11} w{i % 7} s{i}" for i in numbers],
                               [f"s{i} w{i % 7} w{i % 11}" for i in numbers])


def test_build_cli_then_training_from_the_tfds_dataset(tmp_path):
  src, tgt = write_split(tmp_path, "train", 200)
  dev_src, dev_tgt = write_split(tmp_path, "val", 10, 500)
  out = tmp_path / "tfds"
  result = testutil.run_cli("tf_transformer.bin.build_dataset", f"--src={src}", f"--tgt={tgt}",
                            f"--dev_src={dev_src}", f"--dev_tgt={dev_tgt}", "--src_lang=src",
                            "--tgt_lang=tgt", "--name=cli_corpus", f"--out={out}", timeout=400)
  assert result.returncode == 0, result.stderr
  assert f"--dataset=tfds:cli_corpus --tfds_data_dir={out}" in result.stdout
  result = testutil.run_cli("tf_transformer.train", "--flagfile=flags/tiny.cfg",
                            "--dataset=tfds:cli_corpus", f"--tfds_data_dir={out}",
                            "--src_lang=src", "--tgt_lang=tgt", f"--model_dir={tmp_path / 'model'}",
                            "--train_steps=20", "--eval_every=20", timeout=400)
  assert result.returncode == 0, result.stderr
  assert "tfds:cli_corpus: 200 training pairs; splits train, validation" in result.stderr
  results = json.loads((tmp_path / "model" / "results.json").read_text())
  dev = summaries(tmp_path / "model" / "eval")
  # the dev BLEU of results.json is that of the evaluation at step 20 ...
  assert results["step"] == 20 and dev["bleu"] == [(20, np.float32(results["best_dev_bleu"]))]
  # ... which translated the dataset's validation split (its first sentences are shown)
  [(_, shown)] = dev["translations"]
  samples = re.findall(r"\*\*source\*\* (.*?)  \n\*\*reference\*\* (.*?)  \n", shown.decode())
  validation = set(zip(*(pathlib.Path(path).read_text().splitlines()
                         for path in (dev_src, dev_tgt))))
  assert len(samples) == 4 and set(samples) <= validation, samples


def test_build_cli_refuses_mismatched_files(tmp_path):
  src, _ = write_split(tmp_path, "train", 5)
  short = testutil.write_lines(tmp_path / "short.tgt", ["a", "b"])
  result = testutil.run_cli("tf_transformer.bin.build_dataset", f"--src={src}", f"--tgt={short}",
                            "--src_lang=src", "--tgt_lang=tgt", "--name=bad",
                            f"--out={tmp_path / 'out'}", timeout=400)
  testutil.assert_one_line_error(
      result, f"error: {src} has 5 lines but {short} has 2; parallel files must be line-aligned")
