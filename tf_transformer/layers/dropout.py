"""Dropout that draws 16-bit random numbers: half the random-generator work of Keras's."""

import keras
import tensorflow as tf

_LEVELS = 1 << 16  # one draw is uniform over 0 .. 65535


@keras.saving.register_keras_serializable(package="tf_transformer")
class Dropout(keras.layers.Layer):
  """Inverted dropout: each element is zeroed with probability `rate`, the others are scaled
  by 1 / (1 - rate), so the expected output equals the input.

  `keras.layers.Dropout` draws one float32 per element, and its Philox generator is most of
  dropout's cost (dropout took about a tenth of a CPU training step). Here each 32-bit random
  word is split into two 16-bit draws: an element is dropped when its draw is below
  round(rate * 65536). The rate is exact to 1 / 131072, the scale matches the quantised rate
  exactly, and the generator does half the work. Randomness comes from a Keras SeedGenerator,
  as in Keras's layer (made only when rate > 0 and under the same attribute name, so
  checkpoints hold the same variables).
  """

  def __init__(self, rate: float, seed=None, **kwargs):
    super().__init__(**kwargs)
    if not 0.0 <= rate < 1.0:
      raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    self.rate = rate
    self.seed = seed
    self._threshold = round(rate * _LEVELS)
    if rate > 0:
      self.seed_generator = keras.random.SeedGenerator(seed)
    self.built = True

  def call(self, inputs, training=None):
    """inputs: any shape -> the same shape; unchanged unless `training`."""
    if not training or self._threshold == 0:
      return inputs
    size = tf.size(inputs)
    seed = tf.cast(self.seed_generator.next(), tf.int64)
    words = tf.random.stateless_uniform([(size + 1) // 2], seed=seed, minval=None, maxval=None,
                                        dtype=tf.uint32)
    draws = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size]
    keep = tf.reshape(draws >= tf.constant(self._threshold, tf.uint16), tf.shape(inputs))
    scale = tf.cast(_LEVELS / (_LEVELS - self._threshold), inputs.dtype)
    return tf.where(keep, inputs * scale, tf.zeros((), inputs.dtype))

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    config = super().get_config()
    config.update(rate=self.rate, seed=self.seed)
    return config
