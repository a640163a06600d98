"""A dense layer's forward and backward pass: Keras's Dense (autodiff of its matmul) against
`layers/row_matmul.py` (the input gradient as a batched matmul).

    python -m bench.kernels.matmul_grad_speed [--rows 4096 --d_in 256 --d_out 1024 --relu --repeats 30]

Times the gradients of the input, kernel and bias of relu(rows @ kernel + bias) (without
`--relu`: no ReLU) on float32 (or `--dtype=bfloat16`) tensors inside a tf.function, the two
alternating; prints the median milliseconds of each and their ratio, then one JSON line. The
small preset's shapes: d_in 256 with d_out 1024 (the FFN's first layer, with --relu), 768
(self-attention's q/k/v), 512 (cross-attention's k/v) and 256 (the other projections).
"""

import argparse

import keras
import tensorflow as tf

from bench.kernels import layer_race
from tf_transformer.layers.row_matmul import row_matmul


def forward_backward(layer, forward):
  @tf.function
  def run(x, dy):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = forward(x)
    return tape.gradient(y, [x, layer.kernel, layer.bias], output_gradients=dy)
  return run


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", type=int, default=4096)
  parser.add_argument("--d_in", type=int, default=256)
  parser.add_argument("--d_out", type=int, default=1024)
  parser.add_argument("--relu", action="store_true")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--repeats", type=int, default=30)
  args = parser.parse_args()
  dtype = tf.as_dtype(args.dtype)
  layer = keras.layers.Dense(args.d_out, activation="relu" if args.relu else None, dtype=dtype)
  layer.build((None, args.d_in))
  x = tf.cast(tf.random.normal([args.rows, args.d_in]), dtype)
  dy = tf.cast(tf.random.normal([args.rows, args.d_out]), dtype)
  runs = {"keras": forward_backward(layer, layer),
          "tf_transformer": forward_backward(
              layer, lambda x: row_matmul(x, layer.kernel, layer.bias, relu=args.relu))}
  layer_race.race(runs, (x, dy), args.repeats, [args.rows, args.d_in, args.d_out])


if __name__ == "__main__":
  main()
