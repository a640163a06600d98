"""Tests of row_matmul's values and hand-written gradients against float64 numpy."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.layers.row_matmul import row_matmul


def reference(rows, kernel, bias, relu, d_out):
  """Float64 values and gradients (d_rows, d_kernel, d_bias) by the textbook formulas."""
  pre = rows @ kernel + (0.0 if bias is None else bias)
  out = np.maximum(pre, 0.0) if relu else pre
  d_pre = d_out * (pre > 0) if relu else d_out
  return out, d_pre @ kernel.T, rows.T @ d_pre, d_pre.sum(0)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("dtype", [tf.float64, tf.float32])
def test_values_and_gradients_match_a_float64_reference(with_bias, relu, dtype):
  rng = np.random.default_rng(3)
  # d_in < d_out, the shapes whose input gradient takes the batched-matmul path
  rows, kernel = rng.normal(size=(9, 4)), rng.normal(size=(4, 6))
  bias = rng.normal(size=6) if with_bias else None
  d_out = rng.normal(size=(9, 6))
  expected = reference(rows, kernel, bias, relu, d_out)
  inputs = [tf.constant(a, dtype) for a in (rows, kernel) + ((bias,) if with_bias else ())]
  with tf.GradientTape() as tape:
    tape.watch(inputs)
    out = row_matmul(*inputs[:2], inputs[2] if with_bias else None, relu=relu)
    objective = tf.reduce_sum(out * tf.constant(d_out, dtype))
  gradients = tape.gradient(objective, inputs)
  tolerance = 1e-12 if dtype == tf.float64 else 1e-5
  np.testing.assert_allclose(out.numpy(), expected[0], atol=tolerance)
  for got, want in zip(gradients, expected[1:]):
    np.testing.assert_allclose(got.numpy(), want, atol=tolerance)


def test_gradient_reaches_a_variable_kernel():
  kernel = tf.Variable(np.eye(3, 5), dtype=tf.float32)
  rows = tf.ones([2, 3])
  with tf.GradientTape() as tape:
    objective = tf.reduce_sum(row_matmul(rows, kernel))
  np.testing.assert_allclose(tape.gradient(objective, kernel).numpy(), np.full((3, 5), 2.0))
