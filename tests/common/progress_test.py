"""Tests of data_pipeline/progress.py: honest rates and ETAs, plain lines off a terminal."""

import io

import pytest

from common import progress as progress_lib


class _Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


class _Terminal(io.StringIO):
  def isatty(self):
    return True


@pytest.fixture
def clock(monkeypatch):
  fake = _Clock()
  monkeypatch.setattr(progress_lib.time, "monotonic", fake)
  return fake


def test_a_resumed_run_measures_its_eta_from_its_own_start(clock):
  """Resumed at step 9,000 of 10,000 and 100 steps done in 50 s: 900 steps at 2 steps/s are
  left, 7:30, whatever the first 9,000 steps took."""
  stream = io.StringIO()
  bar = progress_lib.ProgressBar(10_000, initial=9_000, stream=stream)
  clock.now += 50
  bar.update(9_100, {"loss": 2.5})
  assert stream.getvalue() == ("9100/10000 steps (91%), 2 steps/s, elapsed 0:50, ETA 7:30, "
                               "loss 2.5\n")


def test_a_time_budget_bounds_the_eta(clock):
  """100,000 steps at 1 step/s would take 27:46:40; a budget of 600 s from the start ends the
  work first, so the ETA counts down to it; a total reached first still counts to the total."""
  stream = io.StringIO()
  bar = progress_lib.ProgressBar(100_000, stream=stream, time_limit_s=600)
  clock.now += 100
  bar.update(100)
  assert stream.getvalue().endswith("elapsed 1:40, ETA 8:20\n")
  clock.now += 600
  bar.update(700, force=True)
  assert stream.getvalue().endswith("elapsed 11:40, ETA 0:00\n")
  bar = progress_lib.ProgressBar(200, stream=stream, time_limit_s=600)
  clock.now += 100
  bar.update(100)
  assert stream.getvalue().endswith("elapsed 1:40, ETA 1:40\n")


def test_off_a_terminal_plain_lines_at_most_every_interval_and_at_the_end(clock):
  stream = io.StringIO()
  bar = progress_lib.ProgressBar(100, unit="sentence", stream=stream, log_every_s=30)
  for count in range(1, 101):
    clock.now += 1
    bar.update(count)
  bar.close()
  lines = stream.getvalue().splitlines()
  # seconds 1, 31, 61 and 91, then the last count (100, at second 100) once
  assert [line.split()[0] for line in lines] == ["1/100", "31/100", "61/100", "91/100",
                                                 "100/100"]
  assert "\r" not in stream.getvalue() and "\033" not in stream.getvalue()
  assert lines[-1] == "100/100 sentences (100%), 1 sentences/s, elapsed 1:40"


def test_on_a_terminal_one_line_redrawn_and_ended(clock):
  stream = _Terminal()
  bar = progress_lib.ProgressBar(4, unit="sentence", label="decoding dev", stream=stream)
  for count in range(1, 5):
    clock.now += 1
    bar.update(count)
  bar.close()
  text = stream.getvalue()
  assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
  assert text.split("\r")[-1].startswith("decoding dev: 4/4 sentences (100%)")


def test_quick_work_stays_silent_and_slow_work_shows(clock):
  quick, slow = io.StringIO(), io.StringIO()
  for stream, seconds in ((quick, 0.5), (slow, 3.0)):
    bar = progress_lib.ProgressBar(None, unit="line", stream=stream, delay_s=2.0)
    clock.now += seconds
    bar.update(10)
    bar.close()
  assert quick.getvalue() == ""
  assert slow.getvalue() == "10 lines, 3.33 lines/s, elapsed 0:03\n"
