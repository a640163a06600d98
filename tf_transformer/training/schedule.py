"""The learning-rate schedule of "Attention Is All You Need", section 5.3."""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tf_transformer")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """lr(step) = learning_rate * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

  Rises linearly for `warmup_steps` steps, peaks at step = warmup_steps with
  learning_rate * (d_model * warmup_steps)^-0.5, then decays with the inverse square root of
  the step. `learning_rate` is the schedule's multiplier (1.0 in the paper), as in
  tensor2tensor and OpenNMT-tf. Steps count from 1: the optimizer's iteration 0 is step 1.
  """

  def __init__(self, d_model: int, warmup_steps: int = 4000, learning_rate: float = 1.0):
    self.d_model = d_model
    self.warmup_steps = warmup_steps
    self.learning_rate = learning_rate

  def __call__(self, iteration):
    step = tf.cast(iteration, tf.float32) + 1.0
    warmup = tf.cast(self.warmup_steps, tf.float32)
    return (self.learning_rate * self.d_model**-0.5) * tf.minimum(tf.math.rsqrt(step),
                                                                  step * warmup**-1.5)

  def get_config(self):
    return {"d_model": self.d_model, "warmup_steps": self.warmup_steps,
            "learning_rate": self.learning_rate}
