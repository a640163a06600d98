"""Fine-tuning (`train --init_from`): a new run starts from another model's weights with a fresh
optimizer, resumes without it, refuses a contradicting architecture, and learns a second task
faster than a run from scratch."""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer import checkpoints, inference, trainer
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import TrainConfig

def reverse_and_shift(n):
  return (n + 5) % testutil.TASK_WORDS


def train(data_dir, model_dir, *args):
  return testutil.run_cli("tf_transformer.train", "--flagfile=flags/tiny.cfg",
                          f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--src_lang=src",
                          "--tgt_lang=tgt", "--eval_sentences=0",
                          # the same trajectory on every CPU kind (bfloat16 where it has units)
                          "--mixed_precision=float32", *args, timeout=600)


@pytest.fixture(scope="module")
def second_task(tmp_path_factory):
  """The second task's data: reverse, and write every word as another."""
  folder = tmp_path_factory.mktemp("second_task")
  testutil.write_word_task(folder, "train", 400, seed=3, mapping=reverse_and_shift)
  testutil.write_word_task(folder, "val", 40, seed=4, mapping=reverse_and_shift)
  return folder


def model_weights(model_dir, checkpoint="latest"):
  model, _, step = inference.load_for_inference(str(model_dir), "src", "tgt", checkpoint)
  return [w.numpy() for w in model.weights], step


def test_a_run_starts_from_the_weights_of_init_from_with_a_fresh_optimizer(
    reversal_model, second_task, tmp_path):
  old = reversal_model[0]
  new = tmp_path / "new"
  # a learning rate so small that one step moves no weight by more than ~1e-9
  result = train(second_task, new, f"--init_from={old}", "--checkpoint=latest",
                 "--train_steps=1", "--learning_rate=1e-9", "--eval_every=1")
  assert result.returncode == 0, result.stderr
  old_weights, old_step = model_weights(old)
  new_weights, new_step = model_weights(new)
  assert (old_step, new_step) == (300, 1)
  assert len(old_weights) == len(new_weights)
  for got, want in zip(new_weights, old_weights):
    np.testing.assert_allclose(got, want, atol=1e-7)
  # the subword model is OLD's, byte for byte
  assert (new / "spm.joint.model").read_bytes() == (old / "spm.joint.model").read_bytes()
  assert json.loads((new / "init.json").read_text()) == {
      "init_from": str(old), "checkpoint": str(old / "ckpt-300"), "step": 300}
  # Adam's moments after one step of a fresh optimizer: m = (1 - b1) g and v = (1 - b2) g^2,
  # so v = 2 m^2 (b1 0.9, b2 0.98); moments carried over from OLD's 300 steps would not be
  model_config = model_dir_lib.read_config(str(new))
  model, optimizer = trainer.create_model(
      model_config, TrainConfig(model_dir=str(new), mixed_precision="float32"),
      tf.distribute.get_strategy())
  checkpoints.restore(tf.train.Checkpoint(model=model, optimizer=optimizer), str(new / "ckpt-1"),
                      partial=True)
  assert int(optimizer.iterations.numpy()) == 1
  for m, v in zip(optimizer._momentums, optimizer._velocities):
    m, v = m.numpy(), v.numpy()
    assert np.abs(m).max() > 0
    np.testing.assert_allclose(v, 2 * m ** 2, rtol=1e-3, atol=1e-30)


def test_a_resumed_fine_tuning_never_reads_init_from(reversal_model, second_task, tmp_path):
  old = reversal_model[0]
  copy = tmp_path / "old_copy"
  shutil.copytree(old, copy)
  new = tmp_path / "new"
  result = train(second_task, new, f"--init_from={copy}", "--train_steps=20", "--eval_every=20",
                 "--save_every=20")
  assert result.returncode == 0, result.stderr
  shutil.rmtree(copy)
  resumed = train(second_task, new, f"--init_from={copy}", "--train_steps=40",
                  "--eval_every=20", "--save_every=20")
  assert resumed.returncode == 0, resumed.stderr
  assert "resumed from" in resumed.stderr and model_weights(new)[1] == 40


def test_a_flag_that_contradicts_init_from_is_a_one_line_error(reversal_model, second_task,
                                                               tmp_path):
  old = reversal_model[0]
  result = train(second_task, tmp_path / "new", f"--init_from={old}", "--d_model=32")
  testutil.assert_one_line_error(
      result, f"error: --d_model=32 contradicts the model of --init_from={old} (d_model=64): "
      "fine-tuning keeps its architecture and vocabulary; drop the flag")
  scratch = tmp_path / "scratch"
  assert train(second_task, scratch, "--train_steps=1").returncode == 0
  result = train(second_task, scratch, f"--init_from={old}", "--train_steps=2")
  testutil.assert_one_line_error(
      result, f"error: --init_from={old}: {scratch} already holds a run trained from scratch; "
      "fine-tune into a new --model_dir")


def test_fine_tuning_learns_a_second_task_faster_than_training_from_scratch(
    reversal_model, second_task, tmp_path):
  old = reversal_model[0]
  runs = {"fine-tuned": [f"--init_from={old}", "--checkpoint=latest"], "scratch": []}
  bleu = {}
  for name, args in runs.items():
    result = train(second_task, tmp_path / name, *args, "--train_steps=100", "--eval_every=100",
                   "--save_every=100", "--warmup_steps=30")
    assert result.returncode == 0, result.stderr
    bleu[name] = json.loads(result.stdout.strip().splitlines()[-1])["best_dev_bleu"]
  # seen: 79.3 against 0.0
  assert bleu["fine-tuned"] > bleu["scratch"] + 40, bleu
