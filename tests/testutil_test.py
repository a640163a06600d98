"""testutil.shared_data: a test that needs ../shared/data skips without it, and fails instead
under REQUIRE_SHARED=1 (CI), so a green CI always ran it."""

import os
import re

import pytest

from tests import testutil


def test_an_absent_shared_folder_skips_the_test(monkeypatch):
  monkeypatch.delenv("REQUIRE_SHARED", raising=False)
  with pytest.raises(BaseException) as outcome:  # pytest's outcomes are BaseExceptions
    testutil.shared_data("no_such_corpus")
  assert outcome.type is pytest.skip.Exception and "no_such_corpus is absent" in str(outcome.value)


def test_an_absent_shared_folder_fails_the_test_under_require_shared(monkeypatch):
  monkeypatch.setenv("REQUIRE_SHARED", "1")
  with pytest.raises(BaseException) as outcome:
    testutil.shared_data("no_such_corpus")
  assert outcome.type is pytest.fail.Exception, outcome.type
  assert "REQUIRE_SHARED=1 requires it" in str(outcome.value)


def test_a_present_shared_folder_is_returned(monkeypatch, tmp_path):
  monkeypatch.setattr(testutil, "SHARED_DATA", tmp_path)
  (tmp_path / "multi30k").mkdir()
  assert testutil.shared_data("multi30k") == tmp_path / "multi30k"


def test_a_skipped_test_shows_in_the_summary_with_its_reason(tmp_path):
  """The suite's own settings (pytest.ini) list each skip and why at the end of a run, so a
  user of README's test command sees which tests did not run without ../shared/data."""
  import subprocess
  import sys

  (tmp_path / "skipping_test.py").write_text(
      "from tests import testutil\n\n"
      "def test_needs_a_corpus():\n"
      "  testutil.shared_data('no_such_corpus')\n")
  environment = {key: value for key, value in os.environ.items() if key != "REQUIRE_SHARED"}
  result = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-c", str(testutil.ROOT / "pytest.ini"),
       "--rootdir", str(testutil.ROOT), str(tmp_path / "skipping_test.py")],
      capture_output=True, text=True, cwd=testutil.ROOT, env=environment, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "short test summary info" in result.stdout, result.stdout
  assert re.search(r"SKIPPED \[1\] .*no_such_corpus is absent", result.stdout), result.stdout
