"""A table of hashes of the project's outputs, to show that a change meant to keep behaviour
(modules moved into subpackages) changes no output, bit for bit.

    python -m bench.output_hashes --out=before.json [--workdir=DIR]   # at the old commit
    python -m bench.output_hashes --out=after.json                    # at the new one
    python -m bench.output_hashes --compare before.json after.json    # exit 1 on a difference

It reaches the project only through interfaces that survive such a move: the command-line
tools run as subprocesses (`python -m tf_transformer.train`, `tf_transformer.bin.translate`,
`.evaluate`, `.export_saved_model`, `.export_ctranslate2`), the public Python API
(`tf_transformer.load`) and the exported SavedModels, loaded with `tf.saved_model.load` and
called through their signatures. What it runs, on a word-reversal task it writes itself
(2-6 words w0..w12, each target its source reversed) with flags/tiny.cfg's dims in float32:

  - train: two short runs (seeds 1234 and 2; the second starts from the first's subword
    model, so that they make an ensemble): their last JSON line, the training and dev scalars
    of their TensorBoard events (the losses every 50 steps among them), the text and images
    logged, the files they write, and every tensor of each checkpoint (training's, best/,
    average/, ema/; final.json names the final one);
  - cli: translate in each of its modes (beam 4 and 1, alpha, n-best, sampling, target
    prefixes, terminology constraints, scoring, alignments, streaming, token batches, another
    checkpoint, an ensemble of the two runs, a SavedModel), most with and without
    --decode_jit, and evaluate;
  - api: `tf_transformer.load(...)`: translate, score and align in the same modes, through the
    graph and the XLA search; other checkpoints and a weighted ensemble; an export;
  - export: export_saved_model in float32 (XLA and graph), int8, bfloat16, int8 with a
    shortlist, with in-graph batching, and of the ensemble: their variables, decoding.json,
    warm-up requests, and the outputs of their signatures on one small request (every
    signature on the float32, int8 and bfloat16 exports, a subset on the others);
  - ct2: export_ctranslate2's files, float32 and int8.

Each row is the sha256 of a canonical serialisation of an output: texts as they are, floats
exactly (float.hex), arrays as dtype, shape and raw bytes. What differs from run to run of the
same code is left out, each where it is read: timings (scalars in seconds, the training clock
in checkpoints, checkpoint state files' timestamps, progress lines), the hparams' start time,
the size of the dataset iterator's saved state, the temporary folder SentencePiece records in
its model, the order of the warm-up requests' protobuf maps, and this run's folder (written
"<workdir>"). The
JSON also keeps a short sample of each output, for debugging, and the environment: the kernels
TensorFlow and XLA choose depend on the CPU and the libraries, so compare tables made on one
machine. About 10-15 minutes on 2 CPU cores.
"""

import dataclasses
import glob
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

flags.DEFINE_string("out", None, "Where the table of hashes goes (JSON).")
flags.DEFINE_string("workdir", None,
                    "Folder for the data, models and exports (kept); default: a temporary "
                    "folder, removed at the end.")
flags.DEFINE_list("parts", ["train", "cli", "api", "export", "ct2"],
                  "The groups of rows to record. Without train, the models already in "
                  "--workdir are used (to rerun the other parts while debugging).")
flags.DEFINE_bool("compare", False,
                  "Compare the two tables named as arguments instead: print each row's status "
                  "and exit with 1 when any differs or is missing from one of them.")
FLAGS = flags.FLAGS

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRESET = "--flagfile=flags/tiny.cfg"
LANGS = ("--src_lang=src", "--tgt_lang=tgt")
TASK_WORDS = 13
SAMPLE_CHARS = 300
SUBWORD_MODEL = "spm.joint.model"  # tiny.cfg's one joint vocabulary

# the two training runs: (name, flags); run1 also keeps a moving average and an average of its
# last checkpoints, so that its final weights are chosen among three candidates
RUNS = (
    ("run1", ("--seed=1234", "--train_steps=150", "--eval_every=50", "--save_every=50",
              "--ema_decay=0.9", "--average_last=3")),
    ("run2", ("--seed=2", "--train_steps=100", "--eval_every=50", "--save_every=50")),
)

# TensorBoard scalars measured in seconds: they differ from run to run
TIMED_SCALARS = ("tokens_per_sec", "eval_seconds")

# checkpoint entries that differ from run to run (trained_seconds: the training clock) or that
# are not a tensor to read (the dataset iterator's state, a variant; the object graph is
# recorded apart, as the checkpoint's structure)
SKIPPED_CHECKPOINT_KEYS = ("trained_seconds", "ITERATOR_STATE", "_CHECKPOINTABLE_OBJECT_GRAPH")


# ---------------------------------------------------------------- canonical forms and rows


def canonical(value):
  """`value` as JSON-serialisable data whose bytes identify it exactly: floats as float.hex,
  arrays (numpy, TensorFlow) as dtype, shape and the sha256 of their bytes, dataclasses (the
  API's Hypothesis) as dicts."""
  if hasattr(value, "numpy") and callable(value.numpy):
    value = value.numpy()
  if isinstance(value, np.ndarray):
    return {"dtype": value.dtype.name, "shape": list(value.shape),
            "sha256": hashlib.sha256(array_bytes(value)).hexdigest()}
  if isinstance(value, (float, np.floating)):
    return f"{np.dtype(type(value)).name}:{float(value).hex()}"
  if isinstance(value, np.integer):
    return int(value)
  if isinstance(value, bytes):
    return value.decode("utf-8", "backslashreplace")
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return canonical(dataclasses.asdict(value))
  if isinstance(value, dict):
    return {str(key): canonical(item) for key, item in sorted(value.items())}
  if isinstance(value, (list, tuple)):
    return [canonical(item) for item in value]
  return value


def array_bytes(array: np.ndarray) -> bytes:
  """The bytes of `array`: its raw buffer, or for an object (string) array each element
  length-prefixed."""
  if array.dtype != object:
    return np.ascontiguousarray(array).tobytes()
  parts = []
  for item in array.reshape(-1):
    data = item if isinstance(item, bytes) else str(item).encode("utf-8")
    parts.append(len(data).to_bytes(8, "little") + data)
  return b"".join(parts)


def readable(value):
  """`value` as short JSON-serialisable data for a person: arrays as nested lists (their first
  rows), floats as they print."""
  if hasattr(value, "numpy") and callable(value.numpy):
    value = value.numpy()
  if isinstance(value, np.ndarray):
    return readable(value[:3].tolist() if value.ndim else value.item())
  if isinstance(value, bytes):
    return value.decode("utf-8", "backslashreplace")
  if isinstance(value, (np.floating, np.integer)):
    return value.item()
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return readable(dataclasses.asdict(value))
  if isinstance(value, dict):
    return {str(key): readable(item) for key, item in sorted(value.items())}
  if isinstance(value, (list, tuple)):
    return [readable(item) for item in value[:6]]
  return value


class Table:
  """The rows recorded: name -> {"sha256", "sample"}."""

  def __init__(self):
    self.rows = {}

  def add(self, name: str, value):
    """Records `value` (text, bytes, or data that `canonical` takes) under `name`."""
    if name in self.rows:
      raise ValueError(f"row {name} recorded twice")
    if isinstance(value, str):
      data, sample = value.encode("utf-8"), value[:SAMPLE_CHARS]
    elif isinstance(value, bytes):
      data, sample = value, f"<{len(value)} bytes>"
    else:
      data = json.dumps(canonical(value), sort_keys=True, ensure_ascii=False).encode("utf-8")
      sample = json.dumps(readable(value), ensure_ascii=False)[:SAMPLE_CHARS]
    self.rows[name] = {"sha256": hashlib.sha256(data).hexdigest(), "sample": sample}
    print(f"  {name}: {self.rows[name]['sha256'][:16]}", flush=True)


# ---------------------------------------------------------------- the task


def word_task(lines: int, seed: int) -> list[tuple[str, str]]:
  """`lines` pairs of 2-6 words w0..w12, each target its source reversed."""
  rng = np.random.default_rng(seed)
  sources = [[f"w{n}" for n in rng.integers(0, TASK_WORDS, rng.integers(2, 7))]
             for _ in range(lines)]
  return [(" ".join(words), " ".join(reversed(words))) for words in sources]


def write_lines(path, lines) -> str:
  """Writes `lines`, one a line; returns the path as str."""
  pathlib.Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return str(path)


def write_corpus(folder, prefix: str, pairs):
  """{folder}/{prefix}.src and .tgt of the (source, target) pairs."""
  write_lines(os.path.join(folder, f"{prefix}.src"), [s for s, _ in pairs])
  write_lines(os.path.join(folder, f"{prefix}.tgt"), [t for _, t in pairs])


@dataclasses.dataclass
class Inputs:
  """The held-out sentences every decoding mode reads, and what each mode adds to them."""
  sources: list
  references: list
  prefixes: list
  constraints: list  # a list of phrases a sentence; "!" before a phrase to avoid


def held_out_inputs() -> Inputs:
  """20 held-out sentences, a blank one and a longer one than any in training, with a target
  prefix for every other sentence and terminology constraints (to include, to avoid, a
  two-word phrase) for most."""
  long = "w1 w2 w3 w4 w5 w6 w7 w8 w9"
  pairs = word_task(20, seed=3) + [("", ""), (long, " ".join(reversed(long.split())))]
  sources, references = [s for s, _ in pairs], [t for _, t in pairs]
  prefixes, constraints = [], []
  for index, (source, reference) in enumerate(pairs):
    # every other sentence: the first one or two words of its reference
    prefixes.append(" ".join(reference.split()[:1 + index // 2 % 2]) if index % 2 == 0 else "")
    constraints.append(_constraints(index, source.split(), prefixes[-1]))
  return Inputs(sources, references, prefixes, constraints)


def _constraints(index: int, words: list[str], prefix: str) -> list[str]:
  """Sentence `index`'s constraints: by turns a word of the source, a word it lacks, a word to
  avoid (the last of its reversal, unless its prefix holds it), a phrase of two, both kinds."""
  if not words:
    return []
  absent = next(f"w{n}" for n in range(TASK_WORDS) if f"w{n}" not in words)
  avoided = "!" + (words[0] if words[0] not in prefix.split() else absent)
  kind = index % 5
  if kind == 0:
    return [words[0]]
  if kind == 1:
    return [absent]
  if kind == 2:
    return [avoided]
  if kind == 3 and len(words) >= 2:
    return [f"{words[1]} {words[0]}"]
  return [words[-1], "!" + absent]


# ---------------------------------------------------------------- running the tools


class Tools:
  """Runs the command-line tools from the repository root, their output kept in `logs`."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.logs = os.path.join(workdir, "logs")
    os.makedirs(self.logs, exist_ok=True)

  def run(self, name: str, module: str, *args, stdin: str | None = None) -> str:
    """`python -m module args`; returns its stdout (stderr goes to logs/<name>.err). A tool
    that fails ends the script with its stderr's last lines."""
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, input=stdin,
                            capture_output=True, text=True, check=False)
    pathlib.Path(self.logs, f"{name}.err").write_text(result.stderr)
    pathlib.Path(self.logs, f"{name}.out").write_text(result.stdout)
    if result.returncode != 0:
      tail = "\n".join(result.stderr.strip().splitlines()[-15:])
      sys.exit(f"error: {name} ({module}) exited with {result.returncode}:\n{tail}")
    print(f"{name}: {time.monotonic() - start:.1f} s", flush=True)
    return result.stdout

  def unplaced(self, text: str) -> str:
    """`text` with this run's folder written as <workdir>."""
    return text.replace(self.workdir, "<workdir>")


# ---------------------------------------------------------------- train


def make_data(workdir: str) -> str:
  """The corpus (train 400, val 30, test 30 pairs) in workdir/data; returns the folder."""
  folder = os.path.join(workdir, "data")
  os.makedirs(folder, exist_ok=True)
  for prefix, lines, seed in (("train", 400, 0), ("val", 30, 1), ("test", 30, 2)):
    write_corpus(folder, prefix, word_task(lines, seed))
  return folder


def train(tools: Tools, table: Table, data: str, models: str):
  """Trains RUNS afresh into models/<name> and records each one's outputs. The runs after the
  first start from its subword model, as the members of an ensemble must (the ensemble loader
  compares the files' bytes, and a model trained anew differs from it in the temporary folder
  SentencePiece records)."""
  first = os.path.join(models, RUNS[0][0])
  for name, run_flags in RUNS:
    model_dir = os.path.join(models, name)
    shutil.rmtree(model_dir, ignore_errors=True)
    if model_dir != first:
      os.makedirs(model_dir)
      shutil.copy(os.path.join(first, SUBWORD_MODEL), model_dir)
    stdout = tools.run(f"train_{name}", "tf_transformer.train", PRESET, *LANGS,
                       f"--data_dir={data}", f"--model_dir={model_dir}", "--test_prefix=test",
                       "--mixed_precision=float32", *run_flags)
    table.add(f"train/{name}/results_line", tools.unplaced(stdout.strip().splitlines()[-1]))
    record_events(table, f"train/{name}", model_dir, tools)
    record_model_dir_files(table, f"train/{name}", model_dir, tools)
    record_checkpoints(table, f"train/{name}", model_dir)


def record_events(table: Table, prefix: str, model_dir: str, tools: Tools):
  """The TensorBoard events of a run, per folder (train/, eval/, the root's hparams) and kind:
  scalars (the per-step losses among them), text, images; wall times and TIMED_SCALARS left
  out."""
  import tensorflow as tf

  for folder in ("train", "eval", "."):
    kinds = {}
    for path in sorted(glob.glob(os.path.join(model_dir, folder, "events.out.tfevents.*"))):
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          kind = value.metadata.plugin_data.plugin_name or "other"
          if value.tag in TIMED_SCALARS:
            continue
          entry = [event.step, value.tag, event_value(value, kind, tools)]
          kinds.setdefault(kind, []).append(entry)
    label = "root" if folder == "." else folder
    for kind, entries in sorted(kinds.items()):
      table.add(f"{prefix}/events/{label}/{kind}", entries)


def event_value(value, kind: str, tools: Tools):
  """A summary value as data: the hparams plugin's session start without its start time (the
  paths in it unplaced), text unplaced, others the tensor itself."""
  import tensorflow as tf

  if kind == "hparams":
    from google.protobuf import json_format
    from tensorboard.plugins.hparams import plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    data.session_start_info.start_time_secs = 0
    return json.loads(tools.unplaced(json_format.MessageToJson(data, sort_keys=True)))
  array = tf.make_ndarray(value.tensor)
  if kind == "text":
    return [tools.unplaced(item.decode("utf-8")) for item in array.reshape(-1)]
  return array


def record_model_dir_files(table: Table, prefix: str, model_dir: str, tools: Tools):
  """The JSON files, subword model and test hypotheses a run writes (paths unplaced); the
  `checkpoint` state files hold timestamps and are left out."""
  names = sorted(os.path.relpath(path, model_dir)
                 for pattern in ("*.json", "*/*.json", "*.model", "*.txt")
                 for path in glob.glob(os.path.join(model_dir, pattern)))
  for name in names:
    table.add(f"{prefix}/files/{name}", file_contents(os.path.join(model_dir, name), tools))


def file_contents(path: str, tools: Tools):
  """A file's bytes; text (JSON, .txt) with its paths unplaced, a SentencePiece model without
  the temporary folder its trainer ran in (trainer_spec.model_prefix, new each time)."""
  data = pathlib.Path(path).read_bytes()
  if path.endswith((".json", ".txt")):
    return tools.unplaced(data.decode("utf-8"))
  if path.endswith(".model"):
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(data)
    model.trainer_spec.ClearField("model_prefix")
    return model.SerializeToString(deterministic=True)
  return data


def record_checkpoints(table: Table, prefix: str, model_dir: str):
  """Every checkpoint of a run (training's, best/, average/, ema/): its tensors, and its
  structure (names, dtypes, shapes)."""
  import tensorflow as tf

  for folder in ("", "best", "average", "ema"):
    state = tf.train.get_checkpoint_state(os.path.join(model_dir, folder))
    if state is None:
      continue
    for path in state.all_model_checkpoint_paths:
      name = os.path.relpath(path if os.path.isabs(path) else os.path.join(model_dir, folder,
                                                                             path), model_dir)
      tensors, structure = checkpoint_contents(os.path.join(model_dir, name))
      table.add(f"{prefix}/checkpoint/{name}/tensors", tensors)
      table.add(f"{prefix}/checkpoint/{name}/structure", structure)


def checkpoint_contents(path: str):
  """(name -> array of every tensor but SKIPPED_CHECKPOINT_KEYS, [name, dtype, shape] of
  every entry) of the checkpoint at `path`. The dataset iterator's state is listed without its
  shape: it holds the elements that tf.data's parallel maps and prefetch buffer had ready when
  the checkpoint was written, as many as the threads' timing made (420 to 426 entries in
  runs of the same code, a busy machine's more), though the batches it goes on with are
  the same."""
  import tensorflow as tf

  reader = tf.train.load_checkpoint(path)
  shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
  tensors = {name: reader.get_tensor(name) for name in sorted(shapes)
             if not any(skipped in name for skipped in SKIPPED_CHECKPOINT_KEYS)}
  structure = [[name, dtypes[name].name, None if "ITERATOR_STATE" in name else list(shapes[name])]
               for name in sorted(shapes)]
  return tensors, structure


# ---------------------------------------------------------------- cli


def write_inputs(folder: str, inputs: Inputs) -> dict:
  """The held-out inputs as translate's files; returns {name: path}."""
  os.makedirs(folder, exist_ok=True)
  return {
      "input": write_lines(os.path.join(folder, "input.txt"), inputs.sources),
      "references": write_lines(os.path.join(folder, "references.txt"), inputs.references),
      "prefixes": write_lines(os.path.join(folder, "prefixes.txt"), inputs.prefixes),
      "constraints": write_lines(os.path.join(folder, "constraints.txt"),
                                 ["\t".join(phrases) for phrases in inputs.constraints]),
  }


SAMPLING = ("--strategy=sample", "--sampling_topk=5", "--sampling_topp=0.9",
            "--sampling_temperature=0.8", "--seed=7")


def cli_modes(files: dict, models: str) -> dict:
  """translate's modes: name -> (flags, whether to run it with --decode_jit too)."""
  run1, run2 = (os.path.join(models, name) for name, _ in RUNS)
  single = (f"--model_dir={run1}",)
  ensemble = (f"--ensemble={run1},{run2}",)
  return {
      "beam4": (single, True),
      "greedy": ((*single, "--beam_size=1"), True),
      "alpha0": ((*single, "--alpha=0"), False),
      "alpha1.5_beam3": ((*single, "--alpha=1.5", "--beam_size=3"), False),
      "nbest4": ((*single, "--nbest=4"), True),
      "sample_nbest2": ((*single, *SAMPLING, "--nbest=2"), True),
      "sample_prefix": ((*single, *SAMPLING, f"--target_prefix={files['prefixes']}"), False),
      "prefix_nbest2": ((*single, f"--target_prefix={files['prefixes']}", "--nbest=2"), True),
      "constraints_nbest2": ((*single, f"--constraints={files['constraints']}", "--nbest=2"),
                             True),
      "constraints_prefix": ((*single, f"--constraints={files['constraints']}",
                              f"--target_prefix={files['prefixes']}"), False),
      "score": ((*single, "--score", f"--targets={files['references']}"), True),
      "align": ((*single, "--print_alignment"), True),
      "batch_tokens40": ((*single, "--batch_tokens=40", "--nbest=2"), False),
      "ensemble_nbest2": ((*ensemble, "--nbest=2"), True),
      "ensemble_weighted_score": ((*ensemble, "--ensemble_weights=3,1", "--score",
                                   f"--targets={files['references']}"), False),
      "checkpoint_latest": ((*single, "--checkpoint=latest"), False),
  }


def cli(tools: Tools, table: Table, inputs: Inputs, models: str):
  """translate in each mode of `cli_modes` (with --decode_jit too where it says), in
  --stream mode, and evaluate on the test set."""
  files = write_inputs(os.path.join(tools.workdir, "inputs"), inputs)
  for mode, (mode_flags, also_jit) in cli_modes(files, models).items():
    for jit in (("--nodecode_jit", "--decode_jit") if also_jit else ("--nodecode_jit",)):
      name = f"cli/translate/{mode}/{'xla' if jit == '--decode_jit' else 'graph'}"
      stdout = tools.run(name.replace("/", "_"), "tf_transformer.bin.translate", PRESET, *LANGS,
                         f"--input={files['input']}", jit, *mode_flags)
      table.add(name, stdout)
  run1 = os.path.join(models, RUNS[0][0])
  stdin = "".join(line + "\n" for line in inputs.sources[:6])
  table.add("cli/translate/stream_nbest2/graph", tools.run(
      "cli_translate_stream", "tf_transformer.bin.translate", PRESET, *LANGS,
      f"--model_dir={run1}", "--stream", "--nbest=2", stdin=stdin))
  evaluate(tools, table, run1)


def evaluate(tools: Tools, table: Table, model_dir: str):
  """evaluate on the test set: its report (paths unplaced) and its hypotheses."""
  data = os.path.join(tools.workdir, "data")
  hypotheses = os.path.join(tools.workdir, "inputs", "evaluate_hypotheses.txt")
  stdout = tools.run("cli_evaluate", "tf_transformer.bin.evaluate", PRESET, *LANGS,
                     f"--model_dir={model_dir}", f"--src={data}/test.src",
                     f"--ref={data}/test.tgt", f"--output={hypotheses}")
  table.add("cli/evaluate/report", tools.unplaced(without_progress(stdout)))
  table.add("cli/evaluate/hypotheses", pathlib.Path(hypotheses).read_text())


def without_progress(text: str) -> str:
  """`text` without the progress lines of common/progress.py ("decoding: 30/30 sentences
  (100%), 16.7 sentences/s, elapsed 0:02"): their rates are timings, and off a terminal how
  many lines a bar prints depends on the time it takes."""
  return "".join(line for line in text.splitlines(keepends=True)
                 if not PROGRESS_LINE.match(line))


PROGRESS_LINE = re.compile(r"^[^,\n]*\d+(/\d+)? \w+s\b.*, elapsed \d+:\d\d")


# ---------------------------------------------------------------- api


def api(table: Table, inputs: Inputs, models: str):
  """tf_transformer.load's translate, score and align in each mode, through the graph and the
  XLA search; other checkpoints and an ensemble through the graph search."""
  import tf_transformer

  run1, run2 = (os.path.join(models, name) for name, _ in RUNS)
  for label, jit in (("graph", False), ("xla", True)):
    start = time.monotonic()
    model = tf_transformer.load(run1, decode_jit=jit)
    for mode, call in api_calls(inputs).items():
      table.add(f"api/{mode}/{label}", call(model))
    print(f"api ({label}): {time.monotonic() - start:.1f} s", flush=True)
  start = time.monotonic()
  for checkpoint in ("latest", "best", "average", "ema", "final"):
    model = tf_transformer.load(run1, checkpoint=checkpoint)
    table.add(f"api/checkpoint_{checkpoint}/nbest2/graph",
              model.translate(inputs.sources, nbest=2))
  ensemble = tf_transformer.load([run1, run2], weights=[2, 1])
  calls = api_calls(inputs)
  for mode in ("nbest4", "sample_topk_nbest3", "prefix_nbest2", "constraints_nbest2", "score",
               "align"):
    table.add(f"api/ensemble_weighted/{mode}/graph", calls[mode](ensemble))
  print(f"api (checkpoints, ensemble): {time.monotonic() - start:.1f} s", flush=True)


def api_calls(inputs: Inputs) -> dict:
  """mode -> fn(TranslationModel) -> its outputs on the held-out inputs."""
  sources = inputs.sources
  return {
      "beam4": lambda m: m.translate(sources),
      "greedy": lambda m: m.translate(sources, beam_size=1),
      "alpha0_nbest2": lambda m: m.translate(sources, nbest=2, alpha=0.0),
      "alpha1.5_beam3_nbest3": lambda m: m.translate(sources, nbest=3, alpha=1.5, beam_size=3),
      "nbest4": lambda m: m.translate(sources, nbest=4),
      "batch_size3_nbest2": lambda m: m.translate(sources, nbest=2, batch_size=3),
      "sample_topk_nbest3": lambda m: m.translate(sources, strategy="sample", nbest=3, seed=7,
                                                  sampling_topk=5),
      "sample_topp_temperature": lambda m: m.translate(
          sources, strategy="sample", nbest=2, seed=11, sampling_topp=0.9,
          sampling_temperature=0.7),
      "sample_prefix": lambda m: m.translate(sources, strategy="sample", nbest=2, seed=5,
                                             target_prefix=inputs.prefixes),
      "prefix_nbest2": lambda m: m.translate(sources, nbest=2, target_prefix=inputs.prefixes),
      "constraints_nbest2": lambda m: m.translate(sources, nbest=2,
                                                  constraints=inputs.constraints),
      "constraints_prefix_nbest2": lambda m: m.translate(
          sources, nbest=2, constraints=inputs.constraints, target_prefix=inputs.prefixes),
      "score": lambda m: m.score(sources, inputs.references),
      "score_alpha0": lambda m: m.score(sources, inputs.references, alpha=0.0),
      "align": lambda m: m.align(sources),
  }


# ---------------------------------------------------------------- export

# name -> (export flags, the signatures called; None: every one the export has)
EXPORTS = {
    "float32_xla": ((), None),
    "float32_graph": (("--nodecode_jit",), None),
    "int8": (("--precision=int8",), None),
    "bfloat16": (("--precision=bfloat16",), None),
    "int8_shortlist8": (("--precision=int8", "--shortlist_size=8", "--shortlist_per_source=2"),
                         ("translate_nbest", "translate_constrained", "sample_prefix", "score",
                          "align")),
    "batching": (("--batching", "--batching_max_size=8"),
                 ("serving_default", "translate_nbest", "translate_prefix", "sample", "score")),
    "ensemble_graph": (("--nodecode_jit", "--ensemble_weights=1,2"),
                       ("translate_nbest", "translate_constrained_prefix", "sample_prefix",
                        "score", "align")),
}


def signature_requests(inputs: Inputs) -> dict:
  """signature -> its keyword arguments: the first 6 held-out sentences and the blank one."""
  import tensorflow as tf

  rows = list(range(6)) + [inputs.sources.index("")]

  def text(values):
    return tf.constant([values[i] for i in rows])

  phrases = tf.constant(["\t".join(inputs.constraints[i]) for i in rows])
  seeds = tf.constant([3 * i + 1 for i in range(len(rows))], tf.int64)
  return {
      "serving_default": dict(inputs=text(inputs.sources)),
      "translate_nbest": dict(inputs=text(inputs.sources)),
      "translate_prefix": dict(inputs=text(inputs.sources), prefix=text(inputs.prefixes)),
      "translate_constrained": dict(inputs=text(inputs.sources), constraints=phrases),
      "translate_constrained_prefix": dict(inputs=text(inputs.sources), constraints=phrases,
                                           prefix=text(inputs.prefixes)),
      "sample": dict(inputs=text(inputs.sources), seed=seeds),
      "sample_prefix": dict(inputs=text(inputs.sources), prefix=text(inputs.prefixes),
                            seed=seeds),
      "score": dict(source=text(inputs.sources), target=text(inputs.references)),
      "align": dict(inputs=text(inputs.sources)),
  }


def export(tools: Tools, table: Table, inputs: Inputs, models: str):
  """Each export of EXPORTS: its files, and its signatures called on one request; the
  float32 XLA export through tf_transformer.load and translate --saved_model too."""
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (the SentencePiece ops of the exports)

  run1, run2 = (os.path.join(models, name) for name, _ in RUNS)
  requests = signature_requests(inputs)
  versions = {}
  for name, (export_flags, signatures) in EXPORTS.items():
    export_dir = os.path.join(tools.workdir, "exports", name)
    shutil.rmtree(export_dir, ignore_errors=True)
    model = (f"--ensemble={run1},{run2}",) if name.startswith("ensemble") else (
        f"--model_dir={run1}",)
    stdout = tools.run(f"export_{name}", "tf_transformer.bin.export_saved_model", PRESET,
                       *LANGS, *model, f"--export_dir={export_dir}",
                       f"--data_dir={os.path.join(tools.workdir, 'data')}", *export_flags)
    version = stdout.strip().splitlines()[-1]
    versions[name] = version
    record_export_files(table, f"export/{name}", export_dir, version, tools)
    start = time.monotonic()
    loaded = tf.saved_model.load(version)
    names = sorted(loaded.signatures)
    table.add(f"export/{name}/signature_names", names)
    for signature in signatures or names:
      table.add(f"export/{name}/{signature}", loaded.signatures[signature](**requests[signature]))
    print(f"export {name} signatures: {time.monotonic() - start:.1f} s", flush=True)
  saved_model_api(table, inputs, versions["float32_xla"])
  files = write_inputs(os.path.join(tools.workdir, "inputs"), inputs)
  table.add("cli/translate/saved_model_float32_xla_nbest4", tools.run(
      "cli_translate_saved_model", "tf_transformer.bin.translate",
      f"--saved_model={versions['float32_xla']}", f"--input={files['input']}", "--nbest=4"))


def record_export_files(table: Table, prefix: str, export_dir: str, version: str,
                        tools: Tools):
  """An export's variables (every tensor, and their structure), its settings, warm-up requests
  and batching parameters; the version folder's name (the checkpoint's step, or 1)."""
  table.add(f"{prefix}/version", os.path.relpath(version, export_dir))
  tensors, structure = checkpoint_contents(os.path.join(version, "variables", "variables"))
  table.add(f"{prefix}/variables/tensors", tensors)
  table.add(f"{prefix}/variables/structure", structure)
  extra = os.path.join(version, "assets.extra")
  table.add(f"{prefix}/decoding.json",
            tools.unplaced(pathlib.Path(extra, "decoding.json").read_text()))
  table.add(f"{prefix}/warmup_requests",
            warmup_requests(os.path.join(extra, "tf_serving_warmup_requests")))
  table.add(f"{prefix}/batching_parameters.txt",
            pathlib.Path(export_dir, "batching_parameters.txt").read_text())


def warmup_requests(path: str) -> list:
  """The PredictionLog records of a warm-up file as data (protobuf's JSON form, keys sorted):
  the file's own bytes differ from export to export, as a request's inputs (a protobuf map)
  are written in an order that changes from process to process."""
  import tensorflow as tf
  from google.protobuf import json_format
  from tensorflow_serving.apis import prediction_log_pb2

  return [json_format.MessageToDict(prediction_log_pb2.PredictionLog.FromString(record.numpy()))
          for record in tf.data.TFRecordDataset(path)]


def saved_model_api(table: Table, inputs: Inputs, version: str):
  """An export through tf_transformer.load: translate (n-best, prefixes, constraints,
  samples), score and align."""
  import tf_transformer

  model = tf_transformer.load(version)
  calls = api_calls(inputs)
  for mode in ("beam4", "nbest4", "sample_prefix", "prefix_nbest2", "constraints_nbest2",
               "constraints_prefix_nbest2", "score", "align"):
    table.add(f"api/saved_model_float32_xla/{mode}", calls[mode](model))


# ---------------------------------------------------------------- ct2


def ct2(tools: Tools, table: Table, models: str):
  """export_ctranslate2 in float32 and int8: every file it writes."""
  run1 = os.path.join(models, RUNS[0][0])
  for quantization in ("float32", "int8"):
    output_dir = os.path.join(tools.workdir, "ct2", quantization)
    shutil.rmtree(output_dir, ignore_errors=True)
    tools.run(f"ct2_{quantization}", "tf_transformer.bin.export_ctranslate2", PRESET, *LANGS,
              f"--model_dir={run1}", f"--output_dir={output_dir}",
              f"--quantization={quantization}")
    for path in sorted(pathlib.Path(output_dir).rglob("*")):
      if path.is_file():
        table.add(f"ct2/{quantization}/{path.relative_to(output_dir)}",
                  file_contents(str(path), tools))


# ---------------------------------------------------------------- compare and main


def compare(path_a: str, path_b: str) -> int:
  """Prints each row of two tables as equal, DIFFERENT or missing from one; returns 1 when
  any is not equal, else 0."""
  table_a, table_b = (json.loads(pathlib.Path(path).read_text()) for path in (path_a, path_b))
  rows_a, rows_b = table_a["rows"], table_b["rows"]
  if table_a.get("environment") != table_b.get("environment"):
    print(f"warning: other environments: {table_a.get('environment')} against "
          f"{table_b.get('environment')}")
  names = sorted(set(rows_a) | set(rows_b))
  width = max(map(len, names), default=0)
  counts = {}
  for name in names:
    if name not in rows_a or name not in rows_b:
      status = f"only in {path_a if name in rows_a else path_b}"
    else:
      status = "equal" if rows_a[name]["sha256"] == rows_b[name]["sha256"] else "DIFFERENT"
    counts[status.split(" ")[0]] = counts.get(status.split(" ")[0], 0) + 1
    print(f"{name:<{width}}  {status}")
    if status == "DIFFERENT":
      for path, rows in ((path_a, rows_a), (path_b, rows_b)):
        print(f"{'':<{width}}    {path}: {rows[name]['sample'][:160]!r}")
  print(", ".join(f"{count} {status}" for status, count in sorted(counts.items())))
  return 0 if set(counts) <= {"equal"} else 1


def record(workdir: str) -> dict:
  """Runs FLAGS.parts in `workdir`; returns the table's JSON value."""
  table, tools = Table(), Tools(workdir)
  models = os.path.join(workdir, "models")
  data = make_data(workdir)
  inputs = held_out_inputs()
  seconds = {}
  for part, run in (("train", lambda: train(tools, table, data, models)),
                    ("cli", lambda: cli(tools, table, inputs, models)),
                    ("api", lambda: api(table, inputs, models)),
                    ("export", lambda: export(tools, table, inputs, models)),
                    ("ct2", lambda: ct2(tools, table, models))):
    if part in FLAGS.parts:
      start = time.monotonic()
      run()
      seconds[part] = round(time.monotonic() - start, 1)
  return {"commit": git_commit(), "environment": environment(), "parts": list(FLAGS.parts),
          "seconds": seconds, "rows": table.rows}


def environment() -> dict:
  """What the hashes depend on beside the code: the kernels TensorFlow and XLA pick depend on
  the CPU and the libraries, so tables are comparable on one machine and one environment."""
  import platform

  import tensorflow as tf

  cpu = ""
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                 "")
  return {"python": platform.python_version(), "tensorflow": tf.__version__,
          "cpu": cpu or platform.processor(), "cores": os.cpu_count()}


def git_commit() -> str:
  """The repository's HEAD commit, and "+changes" when a tracked file differs from it."""
  def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip()
  return git("rev-parse", "HEAD") + (
      "+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def main(argv):
  if FLAGS.compare:
    if len(argv) != 3:
      sys.exit("error: --compare takes two tables: --compare A.json B.json")
    sys.exit(compare(argv[1], argv[2]))
  if len(argv) > 1 or not FLAGS.out:
    sys.exit("error: give --out=FILE.json (and no other argument), or --compare A.json B.json")
  start = time.monotonic()
  workdir = os.path.abspath(FLAGS.workdir) if FLAGS.workdir else tempfile.mkdtemp(
      prefix="output_hashes_")
  os.makedirs(workdir, exist_ok=True)
  try:
    result = record(workdir)
  finally:
    if not FLAGS.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  result["seconds"]["total"] = round(time.monotonic() - start, 1)
  pathlib.Path(FLAGS.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
  print(f"{len(result['rows'])} rows in {FLAGS.out}; {result['seconds']}")


if __name__ == "__main__":
  app.run(main)
