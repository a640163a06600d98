"""tests/forked.py: a run forked from the server is what a real `python` run gives."""

import concurrent.futures
import signal
import subprocess
import sys

import pytest

from tests import forked, testutil

_SNIPPET = r"""
import atexit, os, sys, threading, time
print("argv", sys.argv[1:], "name", __name__, "path0", sys.path[0])
print("cwd", os.getcwd(), "env", os.environ.get("FORKED_TEST"))
print("streams", [(s.encoding, s.errors, s.line_buffering, s.write_through)
                  for s in (sys.stdin, sys.stdout, sys.stderr)])
print("stdin", sys.stdin.read().splitlines())
print("to stderr", file=sys.stderr)
os.write(2, b"raw stderr\n")
atexit.register(lambda: print("at exit"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def environment(monkeypatch):
  monkeypatch.setenv("FORKED_TEST", "yes")


@pytest.mark.parametrize("code", [0, 3])
def test_a_snippet_runs_as_in_a_real_python(environment, tmp_path, code):
  argv = ["-c", _SNIPPET, str(code), "two words"]
  real = subprocess.run([sys.executable, *argv], cwd=tmp_path, input="a\nb\n",
                        capture_output=True, text=True)
  fork = forked.run(argv, tmp_path, stdin="a\nb\n")
  assert (fork.returncode, fork.stdout, fork.stderr) == (real.returncode, real.stdout,
                                                         real.stderr) == (
      code, real.stdout, "to stderr\nraw stderr\n")
  assert real.stdout.splitlines()[-2:] == ["thread done", "at exit"]


def test_a_module_runs_as_with_python_m(tmp_path):
  argv = ["-m", "json.tool", "--sort-keys"]
  real = subprocess.run([sys.executable, *argv], cwd=tmp_path, input='{"b": 1, "a": [2]}',
                        capture_output=True, text=True)
  fork = forked.run(argv, tmp_path, stdin='{"b": 1, "a": [2]}')
  assert (fork.returncode, fork.stdout, fork.stderr) == (0, real.stdout, "")
  assert fork.stdout.startswith('{\n    "a"')


@pytest.mark.parametrize("snippet, code, last_line", [
    ("import sys; sys.exit('error: a message')", 1, "error: a message"),
    ("raise ValueError('boom')", 1, "ValueError: boom"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, None)])
def test_exits_and_errors_end_as_in_a_real_python(snippet, code, last_line):
  for run in (testutil.run_python(snippet, fresh=True), forked.run(["-c", snippet], testutil.ROOT)):
    assert run.returncode == code, run.stderr
    assert (run.stderr.strip().splitlines() or [None])[-1] == last_line


def test_tensorflow_is_loaded_and_runs_in_the_forked_process():
  run = forked.run(["-c", "import sys, tensorflow as tf; "
                          "print('tensorflow' in sys.modules, int(tf.reduce_sum(tf.range(5))))"],
                   testutil.ROOT)
  assert run.stdout == "True 10\n", run.stderr


def test_the_file_size_limit_and_the_timeout_hold(tmp_path):
  write = (f"import os; fd = os.open({str(tmp_path / 'big')!r}, os.O_WRONLY | os.O_CREAT); "
           "os.write(fd, bytes(1000)); os.write(fd, b'1')")  # the 1,001st byte is refused
  run = forked.run(["-c", write], tmp_path, file_limit=1000, text=False)
  assert run.returncode == 1 and run.stderr.strip().endswith(b"File too large"), run.stderr
  with pytest.raises(subprocess.TimeoutExpired):
    forked.run(["-c", "import time; time.sleep(30)"], tmp_path, timeout=1)


def test_runs_started_from_several_threads_each_get_their_own_exit_code():
  """Process.start polls the other started processes; from another thread that poll would read
  a run's exit status before its own join does, which then reads nothing (exit code 255)."""
  codes = [3 + n % 100 for n in range(300)]
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    runs = list(pool.map(lambda code: forked.run(["-c", f"import sys; sys.exit({code})"],
                                                 testutil.ROOT), codes))
  assert [run.returncode for run in runs] == codes
