"""The training command as a user runs it: one-line errors, interruption, resume, mirrored."""

import collections
import json
import math
import os
import re

import numpy as np
import tensorflow as tf

from data_pipeline import bucketing
from tests import testutil
from tests.tf_transformer.training.trainer_test import summaries

from tf_transformer import checkpoints


def write_corpus(folder, lines=200):
  """train.src/train.tgt: 2-6 words of 13, the target reversed."""
  words = [[f"w{(i * 7 + j) % 13}" for j in range(2 + i % 5)] for i in range(lines)]
  testutil.write_corpus(folder, "train", [" ".join(w) for w in words],
                        [" ".join(reversed(w)) for w in words])


def train_args(data_dir, model_dir, *args):
  return ["--flagfile=flags/tiny.cfg", f"--data_dir={data_dir}", f"--model_dir={model_dir}",
          "--src_lang=src", "--tgt_lang=tgt", "--dev_prefix=", *args]


def train(data_dir, model_dir, *args):
  return testutil.run_cli("tf_transformer.train", *train_args(data_dir, model_dir, *args))


def test_mismatched_corpus_is_one_line_error(tmp_path):
  testutil.write_lines(tmp_path / "train.src", ["a", "b", "c"])
  testutil.write_lines(tmp_path / "train.tgt.gz", ["x", "y"])
  result = train(tmp_path, tmp_path / "model")
  testutil.assert_one_line_error(
      result, f"error: {tmp_path}/train.src has 3 lines but {tmp_path}/train.tgt.gz has 2; "
      "parallel files must be line-aligned")


def test_missing_flag_is_one_line_error(tmp_path):
  result = testutil.run_cli("tf_transformer.train", "--flagfile=flags/tiny.cfg",
                            f"--model_dir={tmp_path}")
  testutil.assert_one_line_error(result, "error: --data_dir is required (the folder of the "
                                 "corpus files), or --dataset=tfds:NAME")


def final_weights(checkpoint):
  """{name: value} of every floating-point variable of `checkpoint`: the model's weights (most
  of them under the optimizer's names, the path TensorFlow met first), Adam's moments, the
  best dev BLEU; not the training clock (--train_minutes' wall time, no state of the run)."""
  reader = tf.train.load_checkpoint(str(checkpoint))
  return {name: reader.get_tensor(name) for name, dtype in
          reader.get_variable_to_dtype_map().items()
          if dtype.is_floating and not name.startswith("trained_seconds/")}


# runs the train CLI; a SIGINT (Ctrl-C) arrives during step 3, and a SIGTERM inside the save
# that the first one causes (the save's own signal handling is what is tested, not a race with
# a timer)
_INTERRUPTED_RUN = """
import os, signal, sys
import tensorflow as tf
from absl import app
from tf_transformer.training import trainer
from tf_transformer.bin import train

sent = []
def term():
  sent.append(1)
  os.kill(os.getpid(), signal.SIGINT if len(sent) == 1 else signal.SIGTERM)

note, steps = trainer.Trainer._note_shapes, []
def noting(self, shapes):
  steps.append(1)
  if len(steps) == 3:
    term()
  note(self, shapes)
trainer.Trainer._note_shapes = noting

save = tf.train.CheckpointManager.save
def saving(self, *args, **kwargs):
  if len(sent) == 1:  # the save of the interrupted run: the second signal arrives inside it
    term()
  result = save(self, *args, **kwargs)
  print(f"saved after {len(sent)} signals", file=sys.stderr)
  return result
tf.train.CheckpointManager.save = saving

sys.argv = ["train", *sys.argv[1:]]
app.run(train.main)
"""


def test_interrupt_saves_once_and_rerun_resumes_exactly(tmp_path):
  write_corpus(tmp_path)
  interrupted = testutil.run_python(_INTERRUPTED_RUN, *train_args(
      tmp_path, tmp_path / "model", "--train_steps=100000", "--save_every=100000",
      "--eval_every=100000", "--deterministic"))
  stderr = interrupted.stderr
  assert interrupted.returncode == 130, stderr
  assert "Traceback" not in stderr
  # one save, whole, with both signals delivered
  assert stderr.count("saved after ") == 1 and "saved after 2 signals" in stderr, stderr
  last = stderr.strip().splitlines()[-1]
  assert last == (f"stopped at step 3; checkpoint saved in {tmp_path}/model; rerun the same "
                  "command to resume")
  step = 3
  assert sorted(path.name for path in (tmp_path / "model").glob("ckpt-*.index")) == [
      "ckpt-3.index"]

  result = train(tmp_path, tmp_path / "model", f"--train_steps={step + 5}", "--deterministic")
  assert result.returncode == 0, result.stderr
  assert f"resumed from {tmp_path}/model/ckpt-{step} at step {step}" in result.stderr
  # the state saved on the signal is the whole state: the resumed run ends where one run ends
  reference = train(tmp_path, tmp_path / "reference", f"--train_steps={step + 5}",
                    "--deterministic")
  assert reference.returncode == 0, reference.stderr
  resumed = final_weights(tmp_path / "model" / f"ckpt-{step + 5}")
  for name, value in final_weights(tmp_path / "reference" / f"ckpt-{step + 5}").items():
    np.testing.assert_array_equal(resumed[name], value, err_msg=name)


def test_an_rdrop_run_resumes_bit_for_bit_and_shows_its_divergence(tmp_path):
  """--rdrop_alpha with --deterministic: a run stopped at step 2 and resumed to step 4 ends
  with the weights of a run of 4 steps, bit for bit, and TensorBoard's train/ figures hold the
  divergence of the two passes (dropout on: above 0)."""
  write_corpus(tmp_path)
  flags = ("--rdrop_alpha=2", "--dropout_rate=0.3", "--deterministic", "--save_every=2")
  for steps in (2, 4):
    result = train(tmp_path, tmp_path / "model", f"--train_steps={steps}", *flags)
    assert result.returncode == 0, result.stderr
  assert "resumed from" in result.stderr
  reference = train(tmp_path, tmp_path / "reference", "--train_steps=4", *flags)
  assert reference.returncode == 0, reference.stderr
  resumed = final_weights(tmp_path / "model" / "ckpt-4")
  for name, value in final_weights(tmp_path / "reference" / "ckpt-4").items():
    np.testing.assert_array_equal(resumed[name], value, err_msg=name)
  [(step, divergence)] = summaries(tmp_path / "reference" / "train")["rdrop_kl"]
  assert step == 4 and divergence > 0


def test_corrupt_checkpoint_is_one_line_error(tmp_path):
  write_corpus(tmp_path)
  assert train(tmp_path, tmp_path / "model", "--train_steps=2").returncode == 0
  data_file = next((tmp_path / "model").glob("ckpt-2.data-*"))
  data_file.write_bytes(b"\0" * 64)
  result = train(tmp_path, tmp_path / "model", "--train_steps=4")
  assert result.returncode == 1, result.stderr
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {tmp_path}/model/ckpt-2: cannot restore this checkpoint (")
  assert last.endswith("delete it to resume from an earlier one, or use another --model_dir")


# runs the train CLI with one more stage in the input pipeline, as another version of it has
_OTHER_PIPELINE_RUN = """
import sys
from absl import app
from data_pipeline import pipeline
from tf_transformer.bin import train

tokenize_pairs = pipeline.tokenize_pairs
pipeline.tokenize_pairs = lambda *args: lambda pairs: tokenize_pairs(*args)(pairs).prefetch(2)
sys.argv = ["train", *sys.argv[1:]]
app.run(train.main)
"""


def test_a_checkpoint_of_another_pipeline_version_resumes_with_new_data_order(tmp_path):
  write_corpus(tmp_path)
  first = testutil.run_python(_OTHER_PIPELINE_RUN, *train_args(
      tmp_path, tmp_path / "model", "--train_steps=30", "--save_every=10"))
  assert first.returncode == 0, first.stderr
  # --train_minutes logs the clock restored, which must be the checkpoint's, not 0
  result = train(tmp_path, tmp_path / "model", "--train_steps=31", "--train_minutes=100")
  assert result.returncode == 0, result.stderr
  checkpoint = tmp_path / "model" / "ckpt-30"
  assert (f"{checkpoint}: its input-pipeline position is from another version of the pipeline; "
          "resuming its weights and optimizer with a new pass over the data") in result.stderr
  assert f"resumed from {checkpoint} at step 30" in result.stderr
  clock = tf.train.load_checkpoint(str(checkpoint)).get_tensor(
      "trained_seconds/.ATTRIBUTES/VARIABLE_VALUE")
  assert clock >= 1.0  # so that 0 would not print the same
  assert f"train_minutes=100: {clock / 60:.2f} of them trained before" in result.stderr

  def weights(step):
    model_dir = str(tmp_path / "model")
    model = checkpoints.load_for_inference(model_dir, "src", "tgt", f"{model_dir}/ckpt-{step}")[0]
    return np.concatenate([w.numpy().ravel() for w in model.weights])

  # step 31 went on from step 30's weights: it moved them far less than steps 21-30 did
  step_31, steps_21_to_30 = weights(31) - weights(30), weights(30) - weights(20)
  assert 0 < np.linalg.norm(step_31) < 0.5 * np.linalg.norm(steps_21_to_30)


def test_mirrored_on_two_logical_cpus(tmp_path):
  write_corpus(tmp_path)
  result = train(tmp_path, tmp_path / "model", "--train_steps=3", "--distribution=mirrored",
                 "--num_cpu_devices=2")
  assert result.returncode == 0, result.stderr
  assert '"step": 3' in result.stdout
  assert "strategy: MirroredStrategy with 2 replica(s)" in result.stderr  # logged at start
  # --mixed_precision=auto (the preset's) logs its choice: bfloat16 where the CPU has
  # bfloat16 matrix instructions (no GPU here)
  with open("/proc/cpuinfo", encoding="utf-8") as f:
    cpu = set(re.search(r"^flags\s*:(.*)$", f.read(), re.M).group(1).split())
  if cpu & {"avx512_bf16", "amx_bf16"}:
    choice = "mixed_bfloat16 (mixed_precision=auto: bfloat16 matmuls in hardware)"
  else:
    choice = "float32 (mixed_precision=auto: no bfloat16 matmul units found)"
  assert f"precision: {choice}" in result.stderr


def test_multi_worker_on_two_local_processes(tmp_path):
  write_corpus(tmp_path)
  temporary = tmp_path / "tmp"  # where the other worker writes what it must throw away
  temporary.mkdir()

  def start(ports):
    workers = [f"127.0.0.1:{port}" for port in ports]
    processes = []
    for index in range(2):
      tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
      processes.append(testutil.start_cli(
          "tf_transformer.train", *train_args(tmp_path, tmp_path / "model", "--train_steps=3",
                                              "--save_every=2", "--distribution=multi_worker"),
          env=dict(os.environ, TF_CONFIG=json.dumps(tf_config), TMPDIR=str(temporary))))
    return processes

  processes, outputs = testutil.run_on_free_ports(2, start)
  for process, (_, stderr) in zip(processes, outputs):
    assert process.returncode == 0, stderr[-3000:]
  # the chief (worker 0) alone wrote into model_dir; its checkpoint loads
  assert json.loads((tmp_path / "model" / "results.json").read_text())["step"] == 3
  assert not list(temporary.glob("worker_*"))  # worker 1's checkpoints were removed
  checkpoint = str(tmp_path / "model" / "ckpt-3")
  iterations = [name for name, _ in tf.train.list_variables(checkpoint) if "iterations" in name]
  assert int(tf.train.load_checkpoint(checkpoint).get_tensor(iterations[0])) == 3
  # the model a translation loads is the one trained: each of its weights is in ckpt-3
  model, _, step = checkpoints.load_for_inference(str(tmp_path / "model"), "src", "tgt")
  saved = collections.Counter(value.tobytes() for value in final_weights(checkpoint).values())
  loaded = collections.Counter(weight.numpy().tobytes() for weight in model.weights)
  assert step == 3 and len(model.weights) == 51 and not loaded - saved


def test_xla_compiles_exactly_once_per_bucket(tmp_path):
  # 1 to 16 words (one subword each, plus EOS): sentences of every bucket up to --max_length
  words = [[f"w{(i * 7 + j) % 13}" for j in range(1 + i % 16)] for i in range(620)]
  testutil.write_corpus(tmp_path, "train", [" ".join(w) for w in words],
                        [" ".join(reversed(w)) for w in words])
  dump = tmp_path / "xla_dump"  # XLA writes every module it compiles there
  result = testutil.run_cli(
      "tf_transformer.train", *train_args(tmp_path, tmp_path / "model", "--train_steps=80",
                                          "--max_length=16", "--jit_compile", "--noskip_padding",
                                          "--eval_every=1000", "--save_every=1000"),
      env=testutil.xla_dump_env(dump))
  assert result.returncode == 0, result.stderr
  compilations = list(dump.glob("module_*gradients_of*.before_optimizations.txt"))
  shapes = [line for line in result.stderr.splitlines() if "XLA: train step compiled" in line]
  buckets = len(bucketing.bucket_boundaries(16 + 1))  # 4: 8, 12, 16 and 17 tokens
  assert len(shapes) == buckets, shapes  # the corpus reaches every bucket
  assert len(compilations) == buckets, sorted(path.name for path in compilations)


def test_jit_compile_needs_padded_rows(tmp_path):
  write_corpus(tmp_path)
  result = train(tmp_path, tmp_path / "model", "--jit_compile")
  testutil.assert_one_line_error(
      result, "error: --jit_compile and --distribution=tpu need --noskip_padding (the rows of "
      "the real tokens have a data-dependent shape that XLA cannot compile)")


# runs the train CLI, printing the dtypes of the model it built
_PRECISION_PROBE = """
import sys
from absl import app
from tf_transformer.training import run
from tf_transformer.bin import train

create = run.create_model
def probed(*args):
  model, optimizer = create(*args)
  print(f"computes in {model.compute_dtype}, keeps {model.variable_dtype}", file=sys.stderr)
  return model, optimizer
run.create_model = probed

sys.argv = ["train", *sys.argv[1:]]
app.run(train.main)
"""


def test_tiny_preset_trains_in_bfloat16(tmp_path):
  write_corpus(tmp_path)
  result = testutil.run_python(_PRECISION_PROBE, *train_args(
      tmp_path, tmp_path / "model", "--train_steps=60", "--mixed_precision=mixed_bfloat16",
      "--eval_every=60"))
  assert result.returncode == 0, result.stderr
  assert "computes in bfloat16, keeps float32" in result.stderr.splitlines()
  losses = [float(value) for value in re.findall(r", loss (\S+?)(?:,|$)", result.stdout, re.M)]
  assert losses and all(math.isfinite(loss) for loss in losses)
  assert losses[-1] < losses[0]


def assert_every_checkpoint_finite(folder):
  for index in folder.glob("**/ckpt-*.index"):
    reader = tf.train.load_checkpoint(str(index)[:-len(".index")])
    for name, dtype in reader.get_variable_to_dtype_map().items():
      if dtype.is_floating:
        assert np.isfinite(reader.get_tensor(name)).all(), (index, name)


def test_diverging_run_stops_and_names_the_last_good_checkpoint(tmp_path):
  write_corpus(tmp_path)
  result = train(tmp_path, tmp_path / "model", "--learning_rate=1e12", "--save_every=1",
                 "--train_steps=50")
  assert result.returncode == 1, result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert "Traceback" not in result.stderr
  match = re.fullmatch(
      r"error: step (\d+): the loss or the gradients are NaN or Inf; the update was not "
      r"applied; the last good checkpoint is (.*)/ckpt-(\d+); lower --learning_rate or set "
      r"--clip_norm \(or --on_nonfinite=skip to skip such steps\)", last)
  assert match, last
  assert int(match.group(3)) == int(match.group(1)) - 1
  assert match.group(2) == str(tmp_path / "model")
  assert_every_checkpoint_finite(tmp_path / "model")


def test_diverging_run_with_skip_stops_after_too_many_in_a_row(tmp_path):
  write_corpus(tmp_path)
  result = train(tmp_path, tmp_path / "model", "--learning_rate=1e12", "--save_every=1",
                 "--train_steps=50", "--on_nonfinite=skip", "--max_nonfinite_steps=3")
  assert result.returncode == 1, result.stderr
  assert result.stderr.count("the update was not applied (skipped;") == 2
  last = result.stderr.strip().splitlines()[-1]
  assert "NaN or Inf; the update was not applied (3 such steps in a row)" in last, last
  assert_every_checkpoint_finite(tmp_path / "model")
  # TensorBoard counts the skipped steps at the step each one was tried
  tried = [int(step) for step in re.findall(r"step (\d+): the loss or the gradients are NaN",
                                            result.stderr)]
  assert len(tried) == 3
  assert summaries(tmp_path / "model" / "train")["nonfinite_steps"] == [
      (step, count) for step, count in zip(tried, (1.0, 2.0, 3.0))]


def _trained(model_dir) -> dict:
  results = json.loads((model_dir / "results.json").read_text())
  return {"step": results["step"], "minutes": results["trained_minutes"],
          "latest": checkpoints.latest_checkpoint(str(model_dir))}


def test_train_minutes_stops_the_run_and_counts_over_resumes(tmp_path):
  """--train_minutes=0.25 stops a run of 100,000 steps after 15 s of training (the first step's
  tracing included), with a checkpoint of its last step; the same command again trains no
  more; a larger budget goes on from the checkpoint's clock, not from 0."""
  write_corpus(tmp_path)
  model_dir = tmp_path / "model"
  flags = ("--train_steps=100000", "--eval_every=100000", "--save_every=100000")
  result = train(tmp_path, model_dir, *flags, "--train_minutes=0.25")
  assert result.returncode == 0, result.stderr[-3000:]
  first = _trained(model_dir)
  assert 10 < first["step"] < 100000 and 0.25 <= first["minutes"] < 0.6, first
  assert first["latest"].endswith(f"ckpt-{first['step']}")
  assert f"train_minutes=0.25: stopping at step {first['step']}" in result.stderr
  again = train(tmp_path, model_dir, *flags, "--train_minutes=0.25")
  assert again.returncode == 0, again.stderr[-3000:]
  assert _trained(model_dir)["step"] == first["step"]
  more = train(tmp_path, model_dir, *flags, "--train_minutes=0.5")
  assert more.returncode == 0, more.stderr[-3000:]
  second = _trained(model_dir)
  assert second["step"] > first["step"] and 0.5 <= second["minutes"] < 0.9, (first, second)
  # the clock is in the checkpoint, and the second run went on from it
  clock = tf.train.load_checkpoint(first["latest"]).get_tensor(
      "trained_seconds/.ATTRIBUTES/VARIABLE_VALUE")
  assert 15.0 <= clock < 36.0
  assert f"train_minutes=0.5: {clock / 60:.2f} of them trained before" in more.stderr


def test_train_minutes_stops_every_worker_at_the_same_step(tmp_path):
  """Two workers with their own clocks agree on the step to stop at (an all-reduce every 50
  steps), so neither waits for the other forever."""
  write_corpus(tmp_path)
  temporary = tmp_path / "tmp"
  temporary.mkdir()

  def start(ports):
    workers = [f"127.0.0.1:{port}" for port in ports]
    return [testutil.start_cli(
        "tf_transformer.train", *train_args(tmp_path, tmp_path / "model", "--train_steps=400",
                                            "--train_minutes=0.001", "--save_every=1000",
                                            "--distribution=multi_worker"),
        env=dict(os.environ, TMPDIR=str(temporary), TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})))
            for index in range(2)]

  processes, outputs = testutil.run_on_free_ports(2, start)
  for process, (_, stderr) in zip(processes, outputs):
    assert process.returncode == 0, stderr[-3000:]
    assert "train_minutes=0.001: stopping at step 50 " in stderr
  assert _trained(tmp_path / "model")["step"] == 50
