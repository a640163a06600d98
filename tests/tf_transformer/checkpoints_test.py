"""tf_transformer/checkpoints.py: the checkpoint --checkpoint names, restoring it, the sweep of
what a killed save left behind."""

import concurrent.futures
import dataclasses
import logging
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer import checkpoints
from tf_transformer import length_batching
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import DataConfig, DecodeConfig, ModelConfig
from tf_transformer.model import Transformer
from tf_transformer.serving.translator import Translator

MODEL = ModelConfig(100, 100, num_layers=2, d_model=32, num_heads=4, d_ff=64)
DATA = DataConfig(data_dir="data", src_lang="en", tgt_lang="de", vocab_size=100)

def test_partial_saves_are_swept_and_complete_ones_kept(tmp_path):
  variable = tf.Variable(1.0)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable), str(tmp_path), 3,
                                       checkpoint_name="ckpt")
  manager.save(checkpoint_number=5)
  # what a save killed at step 10 leaves: its temporary folder and a half-merged checkpoint
  (tmp_path / "ckpt-10_temp").mkdir()
  (tmp_path / "ckpt-10_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
  (tmp_path / "ckpt-10.index").write_bytes(b"partial")
  (tmp_path / "config.json.tmp-123").write_text("{")
  checkpoints.remove_partial_saves(str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-5.data-00000-of-00001",
                                          "ckpt-5.index"]
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-5")


STEPS = (100, 200, 300, 400)  # the training checkpoints of `checkpoints_dir`
BEST_STEP = 200  # the one also in best/


def write_checkpoints(folder, tiny_model_dir) -> dict:
  """Makes `folder` a model directory (tiny_model_dir's config and vocabulary) with training
  checkpoints ckpt-100 ... ckpt-400 of different random weights (with optimizer moments and
  step counter, as training writes them) and the weights of step 200 in best/.

  Returns:
    {step: [float32 array of each of the model's weights]}.
  """
  for name in ("config.json", "spm.joint.model"):
    shutil.copy(tiny_model_dir / name, folder / name)
  model = Transformer(**dataclasses.asdict(model_dir_lib.read_config(str(folder))))
  optimizer = keras.optimizers.Adam()
  optimizer.build(model.trainable_variables)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer),
                                       str(folder), len(STEPS), checkpoint_name="ckpt")
  best = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(folder / "best"), 1,
                                    checkpoint_name="ckpt")
  rng = np.random.default_rng(0)
  weights = {}
  for step in STEPS:
    for weight in model.weights:
      weight.assign(rng.normal(size=weight.shape).astype(np.float32))
    optimizer.iterations.assign(step)
    weights[step] = [weight.numpy() for weight in model.weights]
    manager.save(checkpoint_number=step)
    if step == BEST_STEP:
      best.save(checkpoint_number=step)
  return weights


@pytest.fixture(scope="module")
def checkpoints_dir(tmp_path_factory, tiny_model_dir):
  """(model directory of `write_checkpoints`, its weights by step)."""
  folder = tmp_path_factory.mktemp("checkpoints")
  return folder, write_checkpoints(folder, tiny_model_dir)


def _loaded_weights(folder, checkpoint):
  model, _, step = checkpoints.load_for_inference(str(folder), "en", "de", checkpoint)
  return [weight.numpy() for weight in model.weights], step


def _assert_weights_equal(got, expected):
  assert len(got) == len(expected)
  for a, b in zip(got, expected):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("checkpoint, step", [("best", BEST_STEP), ("latest", 400),
                                              ("{m}/ckpt-300", 300), ("{m}/best/ckpt-200", 200)])
def test_checkpoint_choice_loads_its_weights_and_step(checkpoints_dir, checkpoint, step):
  folder, weights = checkpoints_dir
  got, got_step = _loaded_weights(folder, checkpoint.replace("{m}", str(folder)))
  assert got_step == step
  _assert_weights_equal(got, weights[step])


def test_best_falls_back_to_the_latest_and_says_so(checkpoints_dir, tmp_path, caplog):
  folder, weights = checkpoints_dir
  shutil.copytree(folder, tmp_path / "model", ignore=shutil.ignore_patterns("best"))
  with caplog.at_level(logging.INFO, logger="absl"):  # whatever verbosity other tests left
    got, step = _loaded_weights(tmp_path / "model", "best")
  assert step == 400
  _assert_weights_equal(got, weights[400])
  assert (f"{tmp_path}/model/best: no best checkpoint (no dev BLEU yet); loading the latest, "
          f"{tmp_path}/model/ckpt-400") in caplog.messages


@pytest.mark.parametrize("checkpoint, message", [
    ("average", "{m}/average: no averaged checkpoint; write one with checkpoints.average (the "
                "tool: python -m tf_transformer.bin.average_checkpoints)"),
    ("ema", "{m}/ema: no moving average of the weights; train with an ema_decay to keep one"),
    ("{m}/ckpt-5", "{m}/ckpt-5: no such checkpoint ({m}/ckpt-5.index is missing); checkpoint "
                   "takes final, best, latest, average, ema or a checkpoint path such as "
                   "{m}/ckpt-1000"),
    ("{m}/best", "{m}/best: no such checkpoint ({m}/best.index is missing); checkpoint takes "
                 "final, best, latest, average, ema or a checkpoint path such as "
                 "{m}/ckpt-1000"),
])
def test_a_checkpoint_that_is_not_there_is_named(checkpoints_dir, checkpoint, message):
  """In the library's words (the settings' names); the tools name their flags."""
  folder, _ = checkpoints_dir
  fill = lambda text: text.replace("{m}", str(folder))
  with pytest.raises(model_dir_lib.ModelDirError) as error:
    checkpoints.load_for_inference(str(folder), "en", "de", fill(checkpoint))
  assert str(error.value) == fill(message)
  flags_form = fill(message).replace("checkpoint takes", "--checkpoint takes").replace(
      "an ema_decay", "an --ema_decay")
  assert error.value.as_flags() == flags_form


def _translate(folder, *args):
  return testutil.run_cli("tf_transformer.bin.translate", "--flagfile=flags/tiny.cfg",
                          f"--model_dir={folder}", "--beam_size=2", "--nbest=2",
                          "--extra_decode_length=4", *args, stdin="aa bb cc\ndd ee\n")


def _nbest(folder, checkpoint, texts):
  """[(index, hypothesis, score)] of the 2-best lists of `texts` that the weights of `folder`'s
  `checkpoint` give, decoded here with _translate's search."""
  model, vocabulary, _ = checkpoints.load_for_inference(str(folder), "en", "de",
                                                      f"{folder}/{checkpoint}")
  translator = Translator(model, vocabulary, DecodeConfig(
      beam_size=2, nbest=2, max_source_length=32, extra_decode_length=4))
  outputs, scores = length_batching.translate_texts(translator.translate_nbest, texts)
  return [(index, hypothesis, score)
          for index, (row, row_scores) in enumerate(zip(outputs, scores))
          for hypothesis, score in zip(row, row_scores)]


def test_translate_and_export_load_the_checkpoint_named(checkpoints_dir, tmp_path):
  folder, _ = checkpoints_dir
  export = ("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
            f"--model_dir={folder}",
            f"--export_dir={tmp_path}", f"--checkpoint={folder}/ckpt-300", "--beam_size=2",
            "--nodecode_jit", "--signatures=serving_default")
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    runs = [pool.submit(_translate, folder), pool.submit(_translate, folder, "--checkpoint=latest"),
            pool.submit(testutil.run_cli, *export)]
  best, latest, exported = [run.result() for run in runs]
  for result in (best, latest, exported):
    assert result.returncode == 0, result.stderr
  # each prints the n-best lists of the weights it names (best/ holds step 200's)
  for result, checkpoint in ((best, "best/ckpt-200"), (latest, "ckpt-400")):
    printed = [line.split(" ||| ") for line in result.stdout.splitlines()]
    expected = _nbest(folder, checkpoint, ["aa bb cc", "dd ee"])
    assert [(int(i), text) for i, text, _ in printed] == [(i, t) for i, t, _ in expected]
    np.testing.assert_allclose([float(score) for *_, score in printed],
                               [score for *_, score in expected], atol=1e-4)
  assert best.stdout != latest.stdout
  versions = [name for name in os.listdir(tmp_path) if name.isdigit()]
  assert versions == ["300"]  # the checkpoint's step


def test_checkpoint_with_a_saved_model_is_one_line_error(tmp_path):
  result = testutil.run_cli("tf_transformer.bin.translate", f"--saved_model={tmp_path}",
                            "--checkpoint=latest")
  testutil.assert_one_line_error(result, "error: --checkpoint picks a checkpoint of "
                                         "--model_dir; a SavedModel holds its own weights")
