"""Fixtures shared by several test files."""

from tf_transformer.bin import cli

cli.set_tensorflow_environment()  # before TensorFlow loads, as in the tools

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from data_pipeline import tokenizer  # noqa: E402
from tests import testutil  # noqa: E402
from tf_transformer import model_dir as model_dir_lib  # noqa: E402
from tf_transformer.config import ModelConfig  # noqa: E402
from tf_transformer.model import build_model  # noqa: E402


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
def vocabulary(tmp_path_factory):
  """A joint SentencePiece vocabulary of 100 pieces over testutil.sentence_pairs."""
  path = str(tmp_path_factory.mktemp("vocab") / "spm.joint.model")
  sentences = [s for pair in testutil.sentence_pairs(300, seed=1) for s in pair]
  tokenizer.train_sentencepiece(sentences, path, vocab_size=100)
  return tokenizer.load_vocabulary(path, path)
