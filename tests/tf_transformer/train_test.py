"""The training command as a user runs it: one-line errors, interruption, resume, mirrored."""

import gzip
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_corpus(folder, lines=200):
  with open(os.path.join(folder, "train.src"), "w") as src, \
      open(os.path.join(folder, "train.tgt"), "w") as tgt:
    for i in range(lines):
      words = [f"w{(i * 7 + j) % 13}" for j in range(2 + i % 5)]
      src.write(" ".join(words) + "\n")
      tgt.write(" ".join(reversed(words)) + "\n")


def train_command(data_dir, model_dir, *args):
  return [sys.executable, "-m", "tf_transformer.train", "--flagfile=flags/tiny.cfg",
          f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--src_lang=src",
          "--tgt_lang=tgt", "--dev_prefix=", *args]


def run(command):
  return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def assert_one_line_error(result, expected):
  assert result.returncode == 1, result.stderr
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == f"error: {expected}"


def test_mismatched_corpus_is_one_line_error(tmp_path):
  (tmp_path / "train.src").write_text("a\nb\nc\n")
  with gzip.open(tmp_path / "train.tgt.gz", "wt") as f:
    f.write("x\ny\n")
  result = run(train_command(tmp_path, tmp_path / "model"))
  assert_one_line_error(result, f"{tmp_path}/train.src has 3 lines but {tmp_path}/train.tgt.gz "
                        "has 2; parallel files must be line-aligned")


def test_missing_flag_is_one_line_error(tmp_path):
  result = run([sys.executable, "-m", "tf_transformer.train", "--flagfile=flags/tiny.cfg",
                f"--model_dir={tmp_path}"])
  assert_one_line_error(result, "--data_dir is required (the folder of the corpus files)")


def test_interrupt_saves_and_rerun_resumes(tmp_path):
  write_corpus(tmp_path)
  command = train_command(tmp_path, tmp_path / "model", "--train_steps=100000",
                          "--save_every=100000", "--eval_every=100000")
  process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
  deadline = time.time() + 240
  while not list((tmp_path / "model").glob("train/events.*")) and time.time() < deadline:
    time.sleep(1)  # the event file appears once the trainer is built, just before step 1
  time.sleep(3)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 130, stderr
  assert "Traceback" not in stderr
  last = stderr.strip().splitlines()[-1]
  assert last.startswith("stopped at step ") and "rerun the same command to resume" in last
  step = int(last.split()[3].rstrip(";"))
  assert step >= 1
  assert (tmp_path / "model" / f"ckpt-{step}.index").exists()

  result = run(train_command(tmp_path, tmp_path / "model", f"--train_steps={step + 5}"))
  assert result.returncode == 0, result.stderr
  assert f"resumed from {tmp_path}/model/ckpt-{step} at step {step}" in result.stderr


def test_corrupt_checkpoint_is_one_line_error(tmp_path):
  write_corpus(tmp_path)
  assert run(train_command(tmp_path, tmp_path / "model", "--train_steps=2")).returncode == 0
  data_file = next((tmp_path / "model").glob("ckpt-2.data-*"))
  data_file.write_bytes(b"\0" * 64)
  result = run(train_command(tmp_path, tmp_path / "model", "--train_steps=4"))
  assert result.returncode == 1, result.stderr
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {tmp_path}/model/ckpt-2: cannot restore this checkpoint (")
  assert last.endswith("delete it to resume from an earlier one, or use another --model_dir")


def test_mirrored_on_two_logical_cpus(tmp_path):
  write_corpus(tmp_path)
  result = run(train_command(tmp_path, tmp_path / "model", "--train_steps=3",
                             "--distribution=mirrored", "--num_cpu_devices=2"))
  assert result.returncode == 0, result.stderr
  assert '"step": 3' in result.stdout
