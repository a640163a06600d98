"""What every CLI shares: --helpshort, flagfile checks, one-line descriptions of errors."""

import errno

import pytest
from absl import flags

from tests import testutil
from tf_transformer import console


@pytest.mark.parametrize("module", ["tf_transformer.translate", "tf_transformer.download"])
def test_helpshort_lists_the_project_flags(module):
  result = testutil.run_cli(module, "--helpshort", timeout=120)
  for flag in ("--beam_size", "--model_dir", "--src_lang"):
    assert flag in result.stdout, result.stdout[:2000]
  assert "(a positive integer)" in result.stdout  # absl bounds show in the help


def test_flagfile_line_without_dashes_is_refused_with_file_and_line(tmp_path):
  inner = tmp_path / "inner.cfg"
  inner.write_text("# a comment\n--beam_size=4\n\nalpha=0.8\n")
  outer = tmp_path / "outer.cfg"
  outer.write_text(f"--flagfile={inner}\n// another comment\n")
  with pytest.raises(flags.Error, match=f"^{inner}:4: 'alpha=0.8' is not a flag"):
    console._check_flagfiles([f"--flagfile={outer}"])
  inner.write_text("--beam_size=4\n")
  console._check_flagfiles([f"--flagfile={outer}"])  # accepted


def test_errors_are_described_in_one_line_naming_the_path():
  assert console.describe(OSError(errno.ENOSPC, "No space left on device", "/x/ckpt")) == (
      "/x/ckpt: No space left on device")
  assert console.describe(console.UserError("--beam_size: bad\nmore")) == "--beam_size: bad"
