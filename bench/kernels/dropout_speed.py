"""Dropout's cost: Keras's layer (one float32 draw per element) against ours (16-bit draws).

    python -m bench.kernels.dropout_speed [--rows 4096 --cols 1024 --repeats 30]

Times the forward and backward pass of each layer at rate 0.1 on a [rows, cols] float32 tensor
inside a tf.function, alternating the two; prints the median milliseconds of each and their
ratio, then one JSON line.
"""

import argparse

import keras
import tensorflow as tf

from bench.kernels import layer_race
from tf_transformer.layers.dropout import Dropout


def forward_backward(layer):
  @tf.function
  def run(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer(x, training=True)
    return [tape.gradient(y, x)]
  return run


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", type=int, default=4096)
  parser.add_argument("--cols", type=int, default=1024)
  parser.add_argument("--repeats", type=int, default=30)
  args = parser.parse_args()
  x = tf.random.normal([args.rows, args.cols])
  runs = {"keras": forward_backward(keras.layers.Dropout(0.1, seed=1)),
          "tf_transformer": forward_backward(Dropout(0.1, seed=1))}
  layer_race.race(runs, (x,), args.repeats, [args.rows, args.cols])


if __name__ == "__main__":
  main()
