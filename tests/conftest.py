"""Fixtures shared by several test files."""

import atexit
import json
import os
import pathlib
import shutil
import tempfile

from tf_transformer.bin import cli

# One XLA compilation cache for the whole run, new and empty at its start, that every process
# of the run (pytest-xdist's workers, the tools they fork or start) reads and writes: the
# tiny models' searches compile the same programs in many processes (a --batching export's
# load alone compiles 54). Made by the first process to load this file (pytest-xdist's
# controller), whose environment the workers inherit; it removes it at exit.
_XLA_CACHE = "TF_TRANSFORMER_TEST_XLA_CACHE"
if _XLA_CACHE not in os.environ:
  os.environ[_XLA_CACHE] = tempfile.mkdtemp(prefix="tf_transformer_xla_cache_")
  atexit.register(shutil.rmtree, os.environ[_XLA_CACHE], ignore_errors=True)
  os.environ["TF_XLA_FLAGS"] = " ".join(
      [os.environ.get("TF_XLA_FLAGS", ""),
       f"--tf_xla_persistent_cache_directory={os.environ[_XLA_CACHE]}"]).strip()
cli.set_tensorflow_environment()  # before TensorFlow loads, as in the tools

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from data_pipeline import tokenizer  # noqa: E402
from tests import testutil  # noqa: E402
from tf_transformer import model_dir as model_dir_lib  # noqa: E402
from tf_transformer.config import ModelConfig  # noqa: E402
from tf_transformer.model import build_model  # noqa: E402


# The modules that take longest, longest first (`--durations=0`, 2026-12-03): pytest-xdist
# (`--dist loadscope --no-loadscope-reorder`) hands out modules in collection order, so these
# start first and the two workers end together rather than one waiting on a long module.
_LONGEST_FIRST = ("export/saved_model_test.py", "export/batching_test.py",
                  "tf_transformer/bin/train_test.py",
                  "tf_transformer/decoding/constrained_translation_test.py",
                  "tf_transformer/bin/export_saved_model_test.py",
                  "export/hostile_requests_test.py", "tf_transformer/bin/import_marian_test.py",
                  "tf_transformer/training/trainer_test.py",
                  "export/ctranslate2_test.py", "tf_transformer/training/fine_tuning_test.py",
                  "tf_transformer/serving/translator_test.py",
                  "tf_transformer/bin/train_kill_test.py", "tf_transformer/inference_test.py",
                  "tf_transformer/bin/translate_test.py", "tf_transformer/multilingual_test.py",
                  "data_pipeline/pipeline_test.py", "tf_transformer/training/train_step_test.py",
                  "tf_transformer/decoding/decoding_test.py", "tensorboard_check_test.py")


def pytest_collection_modifyitems(items):
  rank = {f"tests/{path}": index for index, path in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
  """A model directory (config.json, spm.joint.model, ckpt-1) of a random 1-layer model."""
  folder = tmp_path_factory.mktemp("model")
  sentences = [" ".join(chr(97 + (i * j) % 26) * 2 for j in range(1, 6)) for i in range(300)]
  tokenizer.train_sentencepiece(sentences, str(folder / "spm.joint.model"), 60)
  vocabulary = tokenizer.load_vocabulary(str(folder / "spm.joint.model"),
                                         str(folder / "spm.joint.model"))
  config = ModelConfig(vocabulary.source_size, vocabulary.target_size, num_layers=1, d_model=32,
                       num_heads=4, d_ff=64)
  model_dir_lib.check_config(str(folder), config)
  keras.utils.set_random_seed(0)
  model = build_model(config)
  tf.train.Checkpoint(model=model).save(str(folder / "ckpt"))
  return folder


@pytest.fixture(scope="session")
def other_tiny_model_dir(tiny_model_dir, tmp_path_factory):
  """tiny_model_dir's architecture and subword model with other random weights: an ensemble
  member that differs from it."""
  folder = tmp_path_factory.mktemp("other_model")
  for name in ("spm.joint.model", "config.json"):
    shutil.copy(tiny_model_dir / name, folder / name)
  keras.utils.set_random_seed(1)
  model = build_model(model_dir_lib.read_config(str(folder)))
  tf.train.Checkpoint(model=model).save(str(folder / "ckpt"))
  return folder


@pytest.fixture(scope="session")
def vocabulary(tmp_path_factory):
  """A joint SentencePiece vocabulary of 100 pieces over testutil.sentence_pairs."""
  path = str(tmp_path_factory.mktemp("vocab") / "spm.joint.model")
  sentences = [s for pair in testutil.sentence_pairs(300, seed=1) for s in pair]
  tokenizer.train_sentencepiece(sentences, path, vocab_size=100)
  return tokenizer.load_vocabulary(path, path)


@pytest.fixture(scope="session")
def reversal_model(tmp_path_factory):
  """A tiny.cfg model trained in float32 for 300 steps to reverse strings of 2-6 words
  (testutil.write_word_task: train 400, val 30 and test 30 pairs), a checkpoint and an
  evaluation every 100 steps, a moving average (decay 0.9) and its final weights chosen on dev
  among the best checkpoint, the average of the last 3 and the moving average. Unlike a random
  model, it ends its translations with </s>.

  Returns:
    (model folder, the dev pairs, the run's results: the last JSON line of train).
  """

  def make(folder):
    testutil.write_word_task(folder, "train", 400, seed=0)
    dev = testutil.write_word_task(folder, "val", 30, seed=1)
    testutil.write_word_task(folder, "test", 30, seed=2)
    result = testutil.run_cli(
        "tf_transformer.train", "--flagfile=flags/tiny.cfg", f"--data_dir={folder}",
        f"--model_dir={folder / 'model'}", "--src_lang=src", "--tgt_lang=tgt",
        "--test_prefix=test", "--train_steps=300", "--eval_every=100", "--save_every=100",
        "--ema_decay=0.9", "--average_last=3", "--mixed_precision=float32", timeout=600)
    assert result.returncode == 0, result.stderr
    return str(folder / "model"), dev, json.loads(result.stdout.strip().splitlines()[-1])

  model_dir, dev, results = testutil.once_per_run(tmp_path_factory, "reversal", make)
  return pathlib.Path(model_dir), [tuple(pair) for pair in dev], results


@pytest.fixture(scope="session")
def reversal_export(reversal_model, tmp_path_factory):
  """reversal_model's final weights exported without XLA, with the search of
  testutil.REVERSAL_EXPORT_SEARCH (inputs over 10 pieces are cut): the SavedModel's version
  folder."""
  model_dir = reversal_model[0]

  def make(folder):
    result = testutil.run_cli(
        "tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
        f"--model_dir={model_dir}", f"--export_dir={folder}", "--nodecode_jit",
        *testutil.REVERSAL_EXPORT_FLAGS)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]  # the version folder, numbered by the step

  return pathlib.Path(testutil.once_per_run(tmp_path_factory, "reversal_export", make))
