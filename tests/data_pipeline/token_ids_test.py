"""Tests of data_pipeline/token_ids.py: the decoder input is the target shifted right."""

import numpy as np
import tensorflow as tf

from data_pipeline import pipeline
from data_pipeline.token_ids import BOS_ID, decoder_inputs


def test_decoder_inputs_by_hand():
  target = tf.constant([[5, 6, 7, 3, 0], [8, 3, 0, 0, 0]], tf.int32)
  target_input = decoder_inputs(target)
  np.testing.assert_array_equal(target_input, [[2, 5, 6, 7, 0], [2, 8, 0, 0, 0]])
  assert target_input.dtype == tf.int32


def test_decoder_inputs_full_row():
  np.testing.assert_array_equal(decoder_inputs(tf.constant([[5, 6, 3]])), [[BOS_ID, 5, 6]])


def test_pipeline_adds_the_decoder_inputs_between_source_and_target():
  source = tf.constant([[11, 12, 3, 0, 0], [13, 3, 0, 0, 0]], tf.int32)
  target = tf.constant([[5, 6, 7, 3, 0], [8, 3, 0, 0, 0]], tf.int32)
  got_source, target_input, got_target = pipeline.add_decoder_inputs(source, target)
  np.testing.assert_array_equal(got_source, source)
  np.testing.assert_array_equal(got_target, target)
  np.testing.assert_array_equal(target_input, decoder_inputs(target))
