"""The optimizer of the paper: Adam on the Noam schedule."""

import keras

from tf_transformer.schedule import NoamSchedule


def make_optimizer(model_config, train_config) -> keras.optimizers.Optimizer:
  """Adam(0.9, 0.98, 1e-9) on the Noam schedule (section 5.3); with dynamic loss scaling
  under mixed_float16, whose gradients would otherwise underflow."""
  c = train_config
  optimizer = keras.optimizers.Adam(
      NoamSchedule(model_config.d_model, c.warmup_steps, c.learning_rate), beta_1=0.9,
      beta_2=0.98, epsilon=1e-9, global_clipnorm=c.clip_norm or None)
  if c.mixed_precision == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer
