"""Tests of tf_transformer/bin/stderr_filter.py: TensorFlow's start-up noise goes, the rest stays."""

from tests import testutil

_CHILD = r"""
import os, sys
from tf_transformer.bin import stderr_filter
stderr_filter.filter_stderr()
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
            b"I0000 00:00:1.2 1 port.cc:153] oneDNN custom operations are on. You may see\n"
            b"E0000 00:00:1.3 1 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"
            b"E0000 00:00:1.4 1 session.cc:9] a real C++ error\n")
print("Python's own line", file=sys.stderr)
os.write(2, b"I0000 00:00:1.5 1 cudart_stub.cc:31] Could not find cuda drivers on your machine")
os.write(2, b", GPU will not be used.\nlast words without a newline")
sys.exit("error: the end")
"""


def test_start_up_noise_is_dropped_and_everything_else_kept():
  result = testutil.run_python(_CHILD)
  assert result.returncode == 1
  assert result.stderr == ("E0000 00:00:1.4 1 session.cc:9] a real C++ error\n"
                           "Python's own line\n"
                           "last words without a newlineerror: the end\n")


def test_a_command_line_tool_filters_and_a_library_user_does_not():
  """A tool's run installs the filter; importing the library or a tool's module does not."""
  code = ("import os, tf_transformer.inference, tf_transformer.bin.translate; "
          "os.write(2, b'I0000 port.cc:153] oneDNN custom operations are on.\\n')")
  # real processes: in a forked one (testutil's default) TensorFlow loaded before the run
  library = testutil.run_python(code, fresh=True)
  assert library.stderr.endswith("oneDNN custom operations are on.\n")
  translate = testutil.run_cli("tf_transformer.bin.translate", "--model_dir=/nonexistent",
                               fresh=True)
  assert translate.stderr == "error: /nonexistent: no such directory\n"  # TensorFlow loaded
