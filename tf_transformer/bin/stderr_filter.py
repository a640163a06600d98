"""TensorFlow's C++ start-up noise, filtered out of a command-line tool's stderr."""

import atexit
import os
import re
import sys
import threading

# TensorFlow's C++ start-up lines that say nothing to act on, on every start of a CLI: its
# oneDNN and CUDA probes (a CPU-only machine "fails" cuInit) and absl's pre-init notice.
# TF_CPP_MIN_LOG_LEVEL does not reach them: absl prints them before it reads any setting.
_NATIVE_NOISE = re.compile(
    rb"All log messages before absl::InitializeLog\(\) is called"
    rb"|oneDNN custom operations are on"
    rb"|Could not find cuda drivers on your machine"
    rb"|failed call to cuInit"
    rb"|oneDNN supports DT_INT64 only on platforms with AVX-512"
    rb"|Unable to register cu(DNN|FFT|BLAS) factory"
    rb"|computation placer already registered"
    rb"|This TensorFlow binary is optimized to use available CPU instructions"
    rb"|To enable the following instructions: .* rebuild TensorFlow"
    rb"|TF-TRT Warning: Could not find TensorRT")


def filter_stderr():
  """Drops TensorFlow's known C++ start-up lines from this process's stderr (file descriptor
  2, where C++ writes); every other line, C++ errors and Python's own, passes unchanged.

  Call it before TensorFlow loads. A thread copies stderr through a pipe; at exit the pipe
  is drained, so nothing written before the end is lost.
  """
  sys.stderr.flush()
  original = os.dup(2)
  read_end, write_end = os.pipe()
  os.dup2(write_end, 2)
  os.close(write_end)

  def forward():
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
      pending = b""
      while chunk := pipe.read(65536):
        *lines, pending = (pending + chunk).split(b"\n")
        kept = b"".join(line + b"\n" for line in lines if not _NATIVE_NOISE.search(line))
        if kept:
          os.write(original, kept)
      if pending and not _NATIVE_NOISE.search(pending):
        os.write(original, pending)

  thread = threading.Thread(target=forward, name="stderr-filter", daemon=True)
  thread.start()

  def drain():
    sys.stderr.flush()
    os.dup2(original, 2)  # closes the pipe's write end: the thread reads to its end
    thread.join(timeout=5.0)

  atexit.register(drain)
