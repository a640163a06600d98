"""testutil.shared_data: a test that needs ../shared/data skips without it, and fails instead
under REQUIRE_SHARED=1 (CI), so a green CI always ran it."""

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
