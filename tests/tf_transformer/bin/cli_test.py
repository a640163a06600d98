"""What every CLI shares: --helpshort, flagfile checks, one-line descriptions of errors."""

import errno
import os
import re

import pytest
from absl import flags

from tests import testutil
from common.errors import UserError
from tf_transformer.bin import cli


@pytest.mark.parametrize("module, listed, unlisted", [
    ("tf_transformer.bin.translate", ("--beam_size", "--model_dir", "--src_lang", "--stream"),
     ("--out", "--last")),
    ("tf_transformer.train", ("--beam_size", "--model_dir", "--src_lang"), ("--stream",)),
    ("tf_transformer.bin.download", ("--out", "--base_url"), ("--beam_size", "--stream"))])
def test_helpshort_lists_the_shared_flags_and_the_tools_own(module, listed, unlisted):
  result = testutil.run_cli(module, "--helpshort", timeout=120)
  shown = set(re.findall(r"^  --(?:\[no\])?(\w+):", result.stdout, re.M))
  assert {flag[2:] for flag in listed} <= shown, shown
  assert not {flag[2:] for flag in unlisted} & shown, shown
  if module != "tf_transformer.bin.download":
    assert "(a positive integer)" in result.stdout  # absl bounds show in the help


def test_flagfile_line_without_dashes_is_refused_with_file_and_line(tmp_path):
  inner = tmp_path / "inner.cfg"
  inner.write_text("# a comment\n--beam_size=4\n\nalpha=0.8\n")
  outer = tmp_path / "outer.cfg"
  outer.write_text(f"--flagfile={inner}\n// another comment\n")
  with pytest.raises(flags.Error, match=f"^{inner}:4: 'alpha=0.8' is not a flag"):
    cli._check_flagfiles([f"--flagfile={outer}"])
  inner.write_text("--beam_size=4\n")
  cli._check_flagfiles([f"--flagfile={outer}"])  # accepted


def test_errors_are_described_in_one_line_naming_the_path():
  assert cli.describe(OSError(errno.ENOSPC, "No space left on device", "/x/ckpt")) == (
      "/x/ckpt: No space left on device")
  assert cli.describe(UserError("--beam_size: bad\nmore")) == "--beam_size: bad"


def test_a_first_run_in_a_new_home_prints_only_the_error(tmp_path):
  """A machine that never ran the project: matplotlib (imported by Keras) builds its font
  cache and logs that at INFO; no other library's INFO line reaches a tool's stderr."""
  env = {name: value for name, value in os.environ.items()
         if name not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")}
  env["HOME"] = str(tmp_path)
  result = testutil.run_cli("tf_transformer.bin.translate", "--model_dir=/nonexistent", env=env)
  assert result.stderr == "error: /nonexistent: no such directory\n"
  assert (tmp_path / ".cache" / "matplotlib").is_dir()  # the cache was built in this run


def test_other_libraries_info_lines_are_dropped_and_their_warnings_kept():
  """A tool (cli.run) logs its own INFO lines; another library's INFO lines, through its own
  logger or absl's, are dropped, and its warnings kept."""
  code = """
import logging as std_logging
from absl import logging
from tf_transformer.bin import cli

def main(argv):
  cli.start(argv)
  std_logging.getLogger("somelib").info("chatter")
  std_logging.getLogger("somelib").warning("a warning")
  logging.info("absl chatter from a library")
  logging.warning("an absl warning")

cli.run(main)
"""
  result = testutil.run_python(code)
  assert result.returncode == 0, result.stderr
  assert "chatter" not in result.stderr
  assert "a warning" in result.stderr and "an absl warning" in result.stderr
