"""The optimizer of the paper: Adam on the Noam schedule."""

import keras

from tf_transformer.training.schedule import NoamSchedule


class _SummedGradientAdam(keras.optimizers.Adam):
  """Adam that takes gradients already summed over replicas: the train step sums them itself,
  to measure and clip the sum (Keras would clip each replica's part before summing)."""

  def _all_reduce_sum_gradients(self, grads_and_vars):
    return list(grads_and_vars)


def make_optimizer(model_config, train_config) -> keras.optimizers.Optimizer:
  """Adam(0.9, 0.98, 1e-9) on the Noam schedule (section 5.3); with dynamic loss scaling
  under mixed_float16, whose gradients would otherwise underflow. It applies gradients summed
  over replicas (see train_step.make_train_step, which also clips them). With
  an ema_decay, Keras's own moving average of the weights is kept among its variables, updated
  after each applied step (`finalize_variable_values` copies it into the model)."""
  c = train_config
  optimizer = _SummedGradientAdam(
      NoamSchedule(model_config.d_model, c.warmup_steps, c.learning_rate), beta_1=0.9,
      beta_2=0.98, epsilon=1e-9, use_ema=c.ema_decay > 0,
      ema_momentum=c.ema_decay or 0.99)
  if c.mixed_precision == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer
