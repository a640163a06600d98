"""Tests for the download CLI (the corpora themselves: data_pipeline/public_corpora_test.py)."""

import os

from tests import testutil


def test_cli_failure_is_one_line(tmp_path):
  env = {key: value for key, value in os.environ.items() if "proxy" not in key.lower()}
  dead_url = f"http://127.0.0.1:{testutil.free_port()}"  # nothing listens there
  result = testutil.run_cli("tf_transformer.bin.download", "multi30k", "--out", str(tmp_path),
                            "--base_url", dead_url, env=env, timeout=60)
  assert result.returncode == 1
  assert "Traceback" not in result.stderr
  lines = result.stderr.splitlines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("error: cannot download ")
  assert "--data_dir" in lines[0]


def test_usage_names_the_datasets():
  result = testutil.run_cli("tf_transformer.bin.download", timeout=60)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines() == [
      "error: usage: python -m tf_transformer.bin.download {multi30k|iwslt15_en_vi|iwslt17_de_en} "
      "--out DIR [--base_url URL]"]
