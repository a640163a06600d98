"""Tests of tf_transformer/training/optimizer.py: the paper's Adam on the Noam schedule."""

import keras
import numpy as np

from tf_transformer.config import ModelConfig, TrainConfig
from tf_transformer.training.optimizer import make_optimizer

MODEL = ModelConfig(source_vocab_size=10, target_vocab_size=10, d_model=64)


def test_adam_of_the_paper_on_the_noam_schedule():
  optimizer = make_optimizer(MODEL, TrainConfig(model_dir="", warmup_steps=10, learning_rate=2.0))
  assert isinstance(optimizer, keras.optimizers.Adam)
  assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
  # the peak, at step = warmup_steps (iteration 9): 2.0 * (64 * 10)^-0.5
  optimizer.build([keras.Variable(np.zeros(2, np.float32))])
  optimizer.iterations.assign(9)
  np.testing.assert_allclose(float(optimizer.learning_rate), 2.0 * 640**-0.5, rtol=1e-6)


def test_loss_scaling_only_in_float16():
  plain = make_optimizer(MODEL, TrainConfig(model_dir=""))
  assert not isinstance(plain, keras.optimizers.LossScaleOptimizer)
  bf16 = make_optimizer(MODEL, TrainConfig(model_dir="", mixed_precision="mixed_bfloat16"))
  assert not isinstance(bf16, keras.optimizers.LossScaleOptimizer)
  fp16 = make_optimizer(MODEL, TrainConfig(model_dir="", mixed_precision="mixed_float16"))
  assert isinstance(fp16, keras.optimizers.LossScaleOptimizer)
