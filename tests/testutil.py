"""What the tests share: the repository's paths, corpus writers, subprocess runners, references."""

import concurrent.futures
import fcntl
import gzip
import inspect
import io
import json
import logging
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tarfile

import numpy as np
from absl import flags

from tests import forked
from tf_transformer import config
from tf_transformer.bin import shared_flags  # noqa: F401  (parse_flags parses the tools' flags)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


def shared_data(*parts) -> pathlib.Path:
  """The folder ../shared/data/<parts>, for a test that reads the real corpora. When it is
  absent the test skips, or fails under REQUIRE_SHARED=1 (CI's setting: a green CI ran it)."""
  import pytest

  path = SHARED_DATA.joinpath(*parts)
  if not path.is_dir():
    message = f"{path} is absent"
    if os.environ.get("REQUIRE_SHARED") == "1":
      pytest.fail(f"{message}, and REQUIRE_SHARED=1 requires it", pytrace=False)
    pytest.skip(message)
  return path


def write_lines(path, lines, newline="\n"):
  """Writes `lines` (str or bytes) one a line, gzipped if `path` ends in .gz; returns it as str."""
  data = b"".join((line if isinstance(line, bytes) else line.encode("utf-8")) + newline.encode()
                  for line in lines)
  if str(path).endswith(".gz"):
    with gzip.open(path, "wb") as f:
      f.write(data)
  else:
    pathlib.Path(path).write_bytes(data)
  return str(path)


def write_corpus(folder, prefix, source_lines, target_lines, langs=("src", "tgt"), gz=False):
  """Writes `{folder}/{prefix}.{lang}[.gz]` for both sides; returns the (source, target) paths."""
  suffix = ".gz" if gz else ""
  return tuple(write_lines(os.path.join(folder, f"{prefix}.{lang}{suffix}"), lines)
               for lang, lines in zip(langs, (source_lines, target_lines)))


def write_pairs(folder, prefix, pairs, gz=False, langs=("en", "de")):
  """`write_corpus` of (source, target) pairs."""
  return write_corpus(folder, prefix, [s for s, _ in pairs], [t for _, t in pairs], langs, gz)


def write_tgz(path, members):
  """Writes the .tgz archive `path` of {member name: bytes}."""
  with tarfile.open(path, "w:gz") as tar:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))


def xla_dump_env(dump) -> dict:
  """This process's environment with XLA writing every module it compiles into `dump`, and
  without the run's compilation cache (tests/conftest.py): a program another process compiled
  is compiled again, so the dump counts this process's compilations."""
  env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump}")
  flags = [flag for flag in env.get("TF_XLA_FLAGS", "").split()
           if not flag.startswith("--tf_xla_persistent_cache_directory=")]
  env["TF_XLA_FLAGS"] = " ".join(flags)
  return env


def run_cli(module, *args, stdin=None, env=None, timeout=300, fresh=False):
  """Runs `python -m module args` in the repository root; returns the CompletedProcess. The
  process is forked with TensorFlow already loaded (tests/forked.py) unless `fresh` or `env`
  (an environment TensorFlow may read as it loads) asks for a real `python`."""
  if not fresh and env is None:
    return forked.run(["-m", module, *args], ROOT, stdin=stdin, timeout=timeout)
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, input=stdin, env=env,
                        capture_output=True, text=True, timeout=timeout)


def start_cli(module, *args, env=None):
  """Starts `python -m module args` in the repository root, its output piped; returns the Popen."""
  return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_python(code, *args, cwd=ROOT, timeout=300, fresh=False):
  """Runs the `code` snippet with `args` in a Python process of its own, forked with TensorFlow
  already loaded (tests/forked.py) unless `fresh`; returns the CompletedProcess."""
  if not fresh:
    return forked.run(["-c", code, *args], cwd, timeout=timeout)
  return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                        text=True, timeout=timeout)


def assert_one_line_error(result, message):
  """The process failed with exit code 1, no traceback, and `message` as its last stderr line."""
  assert result.returncode == 1, result.stderr
  assert "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1] == message


def parse_flags(name, *args):
  """Parses flags/{name}.cfg plus `args` afresh, from the repository root (flagfiles name each
  other relative to it)."""
  flags.FLAGS.unparse_flags()
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    flags.FLAGS(["test", f"--flagfile=flags/{name}.cfg", *args])
  finally:
    os.chdir(cwd)
  return flags.FLAGS


def capture_absl_info(caplog, monkeypatch):
  """Makes `caplog` see absl's INFO records whatever earlier tests in this process did to the
  logging tree (its handler on absl's logger itself, at INFO)."""
  logger = logging.getLogger("absl")
  monkeypatch.setattr(logger, "handlers", [*logger.handlers, caplog.handler])
  caplog.set_level(logging.INFO, logger="absl")


def once_per_run(tmp_path_factory, name, make):
  """`make(folder)`'s JSON value, made once per pytest run in a new folder: under pytest-xdist,
  the first worker to ask makes it while the others wait, and they all read the same one.

  Args:
    tmp_path_factory: pytest's.
    name: the folder's name, unique per fixture.
    make: fn(pathlib.Path folder) -> a JSON-serializable value.
  """
  if "PYTEST_XDIST_WORKER" not in os.environ:
    return make(tmp_path_factory.mktemp(name))
  root = tmp_path_factory.getbasetemp().parent  # the run's folder, above each worker's own
  folder, made = root / name, root / f"{name}.json"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if made.exists():
      return json.loads(made.read_text())
    if folder.exists():  # a worker failed making it: start again
      shutil.rmtree(folder)
    folder.mkdir()
    value = make(folder)
    made.write_text(json.dumps(value))
    return value


def _memory_status(field: str) -> int:
  """A field of /proc/self/status in kB ("VmRSS", "VmHWM"), in bytes."""
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def peak_memory_growth(fn):
  """(fn(), how far this process's peak resident memory during fn rose above its resident
  memory at the call, in bytes). Linux's peak (VmHWM), reset first to the resident memory by
  writing "5" to /proc/self/clear_refs: the peak of this call, not of the process's life (as
  ru_maxrss), and not sampled (which would miss a short one)."""
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
  start = _memory_status("VmRSS")
  result = fn()
  return result, _memory_status("VmHWM") - start


# The two functions above, for a child process that does not import this module
PEAK_MEMORY_SOURCE = "".join(inspect.getsource(fn) for fn in (_memory_status,
                                                                peak_memory_growth))


def free_port():
  """A loopback TCP port that nothing listens on (now)."""
  return free_ports(1)[0]


def free_ports(count):
  """`count` different loopback TCP ports that nothing listens on (now): held together while
  they are chosen, so the kernel cannot hand out one of them twice."""
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


# what TensorFlow's gRPC server prints when its port was taken
_CANNOT_BIND = ("Address already in use", "Could not start gRPC server")


def run_on_free_ports(count, start, timeout=400, attempts=3):
  """Runs the processes `start(ports)` starts (a list of Popen with piped text output) on
  `count` free ports, waiting for them all. A port is free when chosen, not when the process
  binds it: when a process could not bind its port (another process took it in between), all
  are stopped and started again on new ports. As soon as one process fails, the others are
  stopped (a worker waits for its peers forever).

  Returns:
    (processes, [(stdout, stderr) of each]) of the last attempt.
  """
  for _ in range(attempts):
    processes = start(free_ports(count))
    outputs = [("", "")] * len(processes)
    try:
      with concurrent.futures.ThreadPoolExecutor(len(processes)) as pool:
        futures = {pool.submit(p.communicate, timeout=timeout): i
                   for i, p in enumerate(processes)}
        for future in concurrent.futures.as_completed(futures):
          outputs[futures[future]] = future.result()
          if processes[futures[future]].returncode != 0:
            for process in processes:
              process.kill()
    finally:
      for process in processes:
        process.kill()
        process.wait()
    if not any(message in stderr for _, stderr in outputs for message in _CANNOT_BIND):
      break
  return processes, outputs


def strip_padding(row, pad_id):
  """`row` without its trailing `pad_id`s, as a tuple."""
  row = list(row)
  while row and row[-1] == pad_id:
    row.pop()
  return tuple(row)


def softmax(x):
  """Softmax over the last axis, in numpy."""
  x = x - x.max(axis=-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(axis=-1, keepdims=True)


def log_softmax(x):
  """Log-softmax over the last axis, in numpy."""
  m = x.max(axis=-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


EN_WORDS = ("the a cat dog house tree river sees likes runs quickly small big green old "
            "young man woman child city near under with").split()
DE_WORDS = ("der die das eine Katze Hund Haus Baum Fluss sieht mag läuft schnell klein groß "
            "grün alt jung Mann Frau Kind Stadt nahe unter mit über Brücke").split()


TASK_WORDS = 13  # write_word_task's words: w0 .. w12


# the search the reversal_export fixture exports (conftest.py)
REVERSAL_EXPORT_FLAGS = ("--beam_size=2", "--max_length=10", "--extra_decode_length=5")
REVERSAL_EXPORT_SEARCH = config.DecodeConfig(beam_size=2, nbest=2, max_source_length=10,
                                             extra_decode_length=5)  # what those flags give


def write_word_task(folder, prefix, lines, seed, mapping=lambda n: n):
  """{prefix}.src/.tgt: 2-6 words w0..w12; each target is the source reversed, every word wN
  written as w(mapping(N)). Returns the (source, target) pairs."""
  rng = np.random.default_rng(seed)
  sources = [[f"w{n}" for n in rng.integers(0, TASK_WORDS, rng.integers(2, 7))]
             for _ in range(lines)]
  targets = [[f"w{mapping(int(word[1:]))}" for word in reversed(words)] for words in sources]
  pairs = [(" ".join(s), " ".join(t)) for s, t in zip(sources, targets)]
  write_corpus(folder, prefix, *zip(*pairs))
  return pairs


def sentence_pairs(num, seed, max_words=25):
  """`num` random (english-ish, german-ish) sentence pairs of 1..max_words words."""
  rng = np.random.default_rng(seed)

  def sentence(words):
    return " ".join(rng.choice(words, size=int(rng.integers(1, max_words + 1))))

  return [(sentence(EN_WORDS), sentence(DE_WORDS)) for _ in range(num)]


def assert_translate_alike(got, want, texts, **search):
  """Two TranslationModels give the same n-best texts of `texts` (`search`: translate's
  keyword arguments) and the same scores within float32 rounding."""
  got, want = (model.translate(texts, **search) for model in (got, want))
  assert [[h.text for h in hs] for hs in got] == [[h.text for h in hs] for hs in want]
  np.testing.assert_allclose([h.score for hs in got for h in hs],
                             [h.score for hs in want for h in hs], rtol=1e-5)


_EXPORT_FRESH_PROCESS = """
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the SentencePiece ops
imported = {name.split(".")[0] for name in sys.modules}  # the top-level modules, as yet
model = tf.saved_model.load(sys.argv[1])
inputs = tf.constant(json.loads(sys.argv[2]))
best = model.signatures["serving_default"](inputs=inputs)
nbest = model.signatures["translate_nbest"](inputs=inputs)
prefixed = model.signatures["translate_prefix"](inputs=inputs, prefix=tf.constant(
    json.loads(sys.argv[3])))
score = model.signatures["score"](source=inputs[:1], target=tf.constant(["aa"]))
many = model.signatures["serving_default"](inputs=tf.constant(["aa bb"] * 1000))
align = model.signatures["align"](inputs=inputs)
seeds = tf.range(tf.size(inputs), dtype=tf.int64)
sampled = model.signatures["sample"](inputs=inputs, seed=seeds)
sampled_prefix = model.signatures["sample_prefix"](inputs=inputs, prefix=tf.constant(
    json.loads(sys.argv[3])), seed=seeds)
terms = tf.constant([sys.argv[4]] + [""] * (len(json.loads(sys.argv[2])) - 1))
constrained = model.signatures["translate_constrained"](inputs=inputs, constraints=terms)
constrained_prefix = model.signatures["translate_constrained_prefix"](
    inputs=inputs, constraints=terms, prefix=tf.constant(json.loads(sys.argv[3])))
modules = {name.split(".")[0] for name in sys.modules}
print(json.dumps({"modules": sorted(modules), "modules_loaded": sorted(modules - imported),
                  "outputs": [o.decode() for o in best["outputs"].numpy()],
                  "scores": best["scores"].numpy().tolist(),
                  "nbest_shape": list(nbest["outputs"].shape),
                  "prefixed": [[o.decode() for o in row] for row in prefixed["outputs"].numpy()],
                  "prefixed_scores": prefixed["scores"].numpy().tolist(),
                  "log_prob": score["log_prob"].numpy().tolist(),
                  "many": int(many["outputs"].shape[0]),
                  "align_outputs": [o.decode() for o in align["outputs"].numpy()],
                  "source_tokens": [[t.decode() for t in row]
                                    for row in align["source_tokens"].numpy()],
                  "target_tokens": [[t.decode() for t in row]
                                    for row in align["target_tokens"].numpy()],
                  "attention": align["attention"].numpy().tolist(),
                  "sampled": [o.decode() for o in sampled["outputs"].numpy()],
                  "sampled_scores": sampled["scores"].numpy().tolist(),
                  "sampled_prefix": [o.decode() for o in sampled_prefix["outputs"].numpy()],
                  "constrained": [[o.decode() for o in row]
                                  for row in constrained["outputs"].numpy()],
                  "constrained_prefix": [[o.decode() for o in row]
                                         for row in constrained_prefix["outputs"].numpy()]}))
"""


# what a process that loads an export must not import (docs/serving.md: it loads with nothing
# but tensorflow and tensorflow_text): the project's packages, the tools' dependencies. (Keras,
# and matplotlib where it is installed, come with tensorflow's and tensorflow_text's imports.)
_NOT_IMPORTED_BY_AN_EXPORT = {"tf_transformer", "data_pipeline", "export", "common", "sacrebleu"}


def run_export_fresh(version, inputs, prefixes, term="") -> dict:
  """_EXPORT_FRESH_PROCESS's results for the export `version` (its folder) over `inputs` and
  `prefixes` (lists of str), and `term` for the first row of the constrained signatures ("":
  none), run in a new interpreter: a process forked from the tests' server
  holds keras, tensorflow_text and sacrebleu already, and would hide a dependency on them.
  Checks that loading and calling the export imported no module that `import tensorflow,
  tensorflow_text` had not, and none of _NOT_IMPORTED_BY_AN_EXPORT at all."""
  result = run_python(_EXPORT_FRESH_PROCESS, str(version), json.dumps(inputs),
                      json.dumps(prefixes), term, cwd="/", fresh=True)
  assert result.returncode == 0, result.stderr
  loaded = json.loads(result.stdout.strip().splitlines()[-1])
  assert loaded["modules_loaded"] == []
  modules = set(loaded["modules"])
  assert "tensorflow_text" in modules
  assert not modules & _NOT_IMPORTED_BY_AN_EXPORT, sorted(modules & _NOT_IMPORTED_BY_AN_EXPORT)
  return loaded
