"""docs/tensorboard_check.py: TensorBoard in headless Chromium shows the run's scalars,
translations and attention images (`.ci/run` installs Chromium)."""

import subprocess
import sys

from tests import testutil


def test_tensorboard_dashboards_show_the_run_in_a_browser(reversal_model, tmp_path):
  """The logs of conftest's reversal model (a tiny.cfg run of 300 steps, evaluated every 100),
  which the check would otherwise train anew."""
  result = subprocess.run([sys.executable, "docs/tensorboard_check.py",
                           f"--model_dir={reversal_model[0]}", f"--screenshots={tmp_path}"],
                          cwd=testutil.ROOT, capture_output=True, text=True, timeout=900)
  lines = result.stdout.strip().splitlines()
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert [line.split(":")[0] for line in lines[-3:]] == ["scalars", "text", "images"]
  assert all(line.split(": ", 1)[1].startswith("ok;") for line in lines[-3:]), lines
  assert "2 images loaded" in lines[-1]
  for dashboard in ("scalars", "text", "images"):
    assert (tmp_path / f"tensorboard_{dashboard}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
