"""Tests of tf_transformer/training/schedule.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.training.schedule import NoamSchedule


def _noam(iteration, d_model, warmup, learning_rate=1.0):
  step = iteration + 1.0
  return learning_rate * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("iteration", [0, 999, 3999, 9999, 99999])
def test_values_match_formula(iteration):
  schedule = NoamSchedule(512, 4000)
  value = float(schedule(tf.constant(iteration)))
  np.testing.assert_allclose(value, _noam(iteration, 512, 4000), rtol=1e-5)


def test_hand_computed_values():
  schedule = NoamSchedule(512, 4000)
  # iteration 0 = step 1: 512^-0.5 * 4000^-1.5
  np.testing.assert_allclose(float(schedule(0)), 1 / (22.627417 * 252982.2), rtol=1e-5)
  # peak at step 4000: (512 * 4000)^-0.5
  np.testing.assert_allclose(float(schedule(3999)), (512 * 4000) ** -0.5, rtol=1e-5)


def test_peak_at_warmup_step():
  warmup = 4000
  schedule = NoamSchedule(512, warmup)
  iterations = np.arange(warmup - 200, warmup + 200)
  values = schedule(tf.constant(iterations)).numpy()
  assert iterations[np.argmax(values)] == warmup - 1
  # linear rise before, inverse square root decay after
  assert np.all(np.diff(values[:200]) > 0)
  assert np.all(np.diff(values[200:]) < 0)


def test_learning_rate_multiplies():
  base = NoamSchedule(256, 100)
  scaled = NoamSchedule(256, 100, learning_rate=2.5)
  for iteration in (0, 50, 99, 1000):
    np.testing.assert_allclose(float(scaled(iteration)), 2.5 * float(base(iteration)),
                               rtol=1e-6)


def test_config_round_trip():
  schedule = NoamSchedule(128, 300, learning_rate=0.7)
  config = schedule.get_config()
  assert config == {"d_model": 128, "warmup_steps": 300, "learning_rate": 0.7}
  clone = NoamSchedule.from_config(config)
  for iteration in (0, 299, 5000):
    assert float(clone(iteration)) == float(schedule(iteration))
  restored = keras.optimizers.schedules.deserialize(
      keras.optimizers.schedules.serialize(schedule))
  assert isinstance(restored, NoamSchedule)
  assert restored.get_config() == config


def test_works_with_adam():
  schedule = NoamSchedule(64, 10, learning_rate=2.0)
  optimizer = keras.optimizers.Adam(learning_rate=schedule)
  variable = tf.Variable([1.0, -2.0])
  for iteration in range(3):
    np.testing.assert_allclose(float(optimizer.learning_rate), _noam(iteration, 64, 10, 2.0),
                               rtol=1e-5)
    optimizer.apply_gradients([(tf.constant([0.5, 0.5]), variable)])
  assert int(optimizer.iterations) == 3
  assert np.all(variable.numpy() < [1.0, -2.0])
