"""Layer normalization's cost: Keras's layer (autodiff of its mean/variance graph) against ours
(`layers/layer_norm.py`, a hand-written gradient).

    python -m bench.kernels.layer_norm_speed [--rows 4096 --cols 256 --repeats 30]

Times the forward and backward pass (gradients of the input, gamma and beta) of each layer on a
[rows, cols] float32 tensor inside a tf.function, alternating the two; prints the median
milliseconds of each and their ratio, then one JSON line.
"""

import argparse

import keras
import tensorflow as tf

from bench.kernels import layer_race
from tf_transformer.layers.layer_norm import LayerNorm


def forward_backward(layer, cols):
  layer.build((None, cols))

  @tf.function
  def run(x, dy):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer(x)
    return tape.gradient(y, [x] + layer.trainable_weights, output_gradients=dy)
  return run


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", type=int, default=4096)
  parser.add_argument("--cols", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=30)
  args = parser.parse_args()
  x = tf.random.normal([args.rows, args.cols])
  dy = tf.random.normal([args.rows, args.cols])
  runs = {"keras": forward_backward(keras.layers.LayerNormalization(epsilon=1e-6), args.cols),
          "tf_transformer": forward_backward(LayerNorm(epsilon=1e-6), args.cols)}
  layer_race.race(runs, (x, dy), args.repeats, [args.rows, args.cols])


if __name__ == "__main__":
  main()
