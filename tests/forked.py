"""`python -m module args` and `python -c code args` without TensorFlow's start-up in each.

A test suite that runs the tools ~150 times spends ~3 s of CPU per run importing TensorFlow,
Keras and tf-text (a third of the suite). Here each run is a process forked from a server that
has imported them once and run no TensorFlow op (so no TensorFlow thread or state is forked):
from the tool's `main` on, the run is the tool's own, in a process of its own, with its own
stdin, stdout, stderr, working directory, environment and exit code. What happens before `main`
(the interpreter's and TensorFlow's start-up) is not what a test of it can see here: such tests
run a real `python` (testutil.run_cli(..., fresh=True)).
"""

import atexit
import io
import json
import multiprocessing
import os
import pathlib
import resource
import runpy
import subprocess
import sys
import tempfile
import threading
import traceback

# loaded once in the server; each is what a tool's main would import first
PRELOAD = ["tensorflow", "keras", "tensorflow_text", "sacrebleu"]

_context = None
_start_lock = threading.Lock()
_python_path = None  # sys.path after its first entry, as a real `python` starts with it


def _server():
  """multiprocessing's fork server, started on first use with PRELOAD imported."""
  global _context, _python_path
  if _context is None:
    _python_path = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        cwd="/", capture_output=True, text=True, check=True).stdout)
    _context = multiprocessing.get_context("forkserver")
    _context.set_forkserver_preload(PRELOAD)
  return _context


def _stream_like(fd, mode, like):
  """A text stream on `fd` set up as this interpreter set up `like` (sys.__stdout__ or
  sys.__stderr__) at its start, as a new `python` would: encoding, errors and buffering."""
  raw = io.FileIO(fd, mode, closefd=False)
  if not isinstance(like.buffer, io.FileIO):  # buffered, unless the interpreter runs unbuffered
    raw = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
  return io.TextIOWrapper(raw, encoding=like.encoding, errors=like.errors,
                          line_buffering=like.line_buffering, write_through=like.write_through)


def _exit_code(code) -> int:
  """What Python exits with after `raise SystemExit(code)`."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


def _child(argv, cwd, python_path, environment, stdin_path, stdout_path, stderr_path,
           file_limit):
  """In the forked process: become `python argv` and never return."""
  if file_limit is not None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
  for target, path, flags in ((0, stdin_path, os.O_RDONLY),
                              (1, stdout_path, os.O_WRONLY),
                              (2, stderr_path, os.O_WRONLY)):
    fd = os.open(path, flags)
    os.dup2(fd, target)
    os.close(fd)
  sys.stdin = _stream_like(0, "r", sys.__stdin__)
  sys.stdout = _stream_like(1, "w", sys.__stdout__)
  sys.stderr = _stream_like(2, "w", sys.__stderr__)
  os.chdir(cwd)
  os.environ.clear()
  os.environ.update(environment)
  sys.path[:] = [cwd if argv[0] == "-m" else "", *python_path]
  code = 0
  try:
    if argv[0] == "-m":
      sys.argv = [argv[1], *argv[2:]]  # run_module replaces [0] with the module's file
      runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
      sys.argv = ["-c", *argv[2:]]
      exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
  except SystemExit as exit_:
    code = _exit_code(exit_.code)
  except BaseException:  # noqa: B036 -- as the interpreter does with an uncaught exception
    traceback.print_exc()
    code = 1
  finally:
    threading._shutdown()  # as at the interpreter's exit: wait for non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError):
        pass
    os._exit(code)


def run(argv, cwd, stdin=None, timeout=300, text=True, file_limit=None):
  """Runs `python *argv` (argv: ["-m", module, *args] or ["-c", code, *args]) in a process
  forked from the server, as subprocess.run(..., capture_output=True) would: with this
  process's environment, `stdin` as its input, and its output captured (as text with `text`,
  else bytes). `file_limit`: the largest file in bytes it may write (RLIMIT_FSIZE)."""
  with tempfile.TemporaryDirectory() as folder:
    folder = pathlib.Path(folder)
    stdin_path, stdout_path, stderr_path = folder / "in", folder / "out", folder / "err"
    stdin_path.write_bytes(stdin.encode() if isinstance(stdin, str) else stdin or b"")
    stdout_path.touch()
    stderr_path.touch()
    process = _server().Process(target=_child, args=(
        list(argv), str(cwd), _python_path, dict(os.environ), str(stdin_path), str(stdout_path),
        str(stderr_path), file_limit))
    with _start_lock:
      process.start()
      # Process.start polls every started process it knows of: from another thread it could
      # read this run's exit status before this thread's join does, which would then get 255
      multiprocessing.process._children.discard(process)
    process.join(timeout)
    if process.exitcode is None:
      process.kill()
      process.join()
      raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
    read = ((lambda path: path.read_text(encoding="utf-8", errors="replace")) if text
            else pathlib.Path.read_bytes)
    return subprocess.CompletedProcess([sys.executable, *argv], process.exitcode,
                                       read(stdout_path), read(stderr_path))
