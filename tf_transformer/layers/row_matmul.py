"""rows @ kernel (+ bias, ReLU) whose input gradient avoids oneDNN's transposed-kernel matmul."""

import tensorflow as tf


def row_matmul(rows, kernel, bias=None, relu: bool = False):
  """max(0, rows @ kernel + bias), or without the bias or the ReLU; the same values and
  gradients as autodiff of those ops.

  Autodiff takes the gradient of `rows` as MatMul(d_out, kernel, transpose_b=True). In float32
  on CPU oneDNN runs that slower than the forward matmul when the kernel is wider than tall
  ([256, 1024] or [256, 768]: the FFN's first layer, the q/k/v projection), while the same
  product as a BatchMatMul with adj_y runs at about the forward's speed: forward and backward
  1.13x and 1.05x faster (`bench/matmul_grad_speed.py`), neutral in bfloat16 and for square
  kernels. The forward ops are unchanged, so oneDNN still fuses matmul, bias and ReLU.

  Args:
    rows: [R, d_in].
    kernel: [d_in, d_out], in the dtype of `rows`.
    bias: optional [d_out].
    relu: apply max(0, .) to the result.

  Returns:
    [R, d_out].
  """
  if bias is None:
    return _matmul(rows, kernel, relu)
  return _matmul_bias(rows, kernel, bias, relu)


def _backward(rows, kernel, outputs, d_outputs, relu):
  """The gradients (d_rows, d_kernel, d_pre_activation) of rows @ kernel (+ ReLU)."""
  if relu:
    d_outputs = tf.raw_ops.ReluGrad(gradients=d_outputs, features=outputs)
  d_rows = tf.raw_ops.BatchMatMulV2(x=d_outputs, y=kernel, adj_y=True)
  d_kernel = tf.matmul(rows, d_outputs, transpose_a=True)
  return d_rows, d_kernel, d_outputs


def _matmul(rows, kernel, relu):
  @tf.custom_gradient
  def forward(rows, kernel):
    outputs = tf.matmul(rows, kernel)
    if relu:
      outputs = tf.nn.relu(outputs)

    def gradient(d_outputs):
      return _backward(rows, kernel, outputs, d_outputs, relu)[:2]

    return outputs, gradient

  return forward(rows, kernel)


def _matmul_bias(rows, kernel, bias, relu):
  @tf.custom_gradient
  def forward(rows, kernel, bias):
    outputs = tf.nn.bias_add(tf.matmul(rows, kernel), bias)
    if relu:
      outputs = tf.nn.relu(outputs)

    def gradient(d_outputs):
      d_rows, d_kernel, d_pre = _backward(rows, kernel, outputs, d_outputs, relu)
      return d_rows, d_kernel, tf.raw_ops.BiasAddGrad(out_backprop=d_pre)

    return outputs, gradient

  return forward(rows, kernel, bias)
