"""A decoding step's matrix products under XLA, their weights read from memory (or L3: --set_mb).

    python -m bench.kernels.step_matmul_speed --rows=4 --shape=256x8000 [--kinds=float32,int8]

Times rows [M, K] @ kernel [K, N] in an XLA-compiled loop over enough distinct kernels
(48 MB in all, more than an L3 cache) that each product streams its kernel from memory, as a
decoding step does with the decoder's weights. Kinds:
  - float32: as the float32 export multiplies;
  - float32_transposed: the kernel stored [N, K] (transpose_b);
  - split_rows: each row a matrix-vector product of its own (XLA emits its own vectorized
    kernel for one row, Eigen's for more);
  - bfloat16: rows and kernel in bfloat16, as the bfloat16 export multiplies;
  - int8: the int8 export's product (layers/precisions.py): int8 rows and kernel, int32 sums;
  - int8_by_column: the same int8 product with the kernel stored [N, K] and the rows
    multiplying it from the right (kernel @ rows^T, transposed back);
  - int8_dequantized: the int8 kernel converted to float32 inside the step, float32 product;
  - multiply_reduce: rows[:, :, None] * kernel summed over K (an XLA loop fusion, no dot);
  - row_blocks: each row a one-row product with each of 8 column blocks of the kernel, the
    kernel stored as [8, K, N / 8] (a block fits in L2 for the rows that follow).
--set_mb=16 keeps the kernels in L3 as a decoder's 19 MB of weights are between steps;
--nojit times TensorFlow's graph MatMul (oneDNN) instead of XLA.
Prints microseconds per product and the float32 bytes of the kernel over that time.
"""

from absl import app, flags

flags.DEFINE_integer("rows", 4, "M: the rows multiplied (the beam of one sentence).")
flags.DEFINE_string("shape", "256x8000", "KxN: the kernel's shape.")
flags.DEFINE_list("kinds", ["float32", "float32_transposed", "split_rows", "bfloat16", "int8",
                            "int8_dequantized"], "What to time.")
flags.DEFINE_float("set_mb", 48, "MB of kernels read in turn: more than L3 streams each "
                   "from memory.")
flags.DEFINE_bool("jit", True, "XLA-compile the loop (else TensorFlow's graph kernels).")
FLAGS = flags.FLAGS

_BLOCKS = 8


def _product(kind, rows, kernel):
  """rows float32 [M, K] times the kernel prepared for `kind` -> float32 [M, N]."""
  import keras
  import tensorflow as tf

  from tf_transformer.layers import precisions
  if kind == "float32":
    return tf.matmul(rows, kernel)
  if kind == "float32_transposed":
    return tf.matmul(rows, kernel, transpose_b=True)
  if kind == "split_rows":
    return tf.concat([tf.matmul(rows[i:i + 1], kernel) for i in range(rows.shape[0])], axis=0)
  if kind == "multiply_reduce":
    return tf.reduce_sum(rows[:, :, tf.newaxis] * kernel[tf.newaxis], axis=1)
  if kind == "row_blocks":
    return tf.concat([tf.concat([tf.matmul(rows[i:i + 1], block) for i in range(rows.shape[0])],
                                axis=0) for block in tf.unstack(kernel)], axis=1)
  if kind == "int8_dequantized":
    values, scale = kernel
    return tf.matmul(rows, tf.cast(values, tf.float32)) * scale
  if kind == "int8_by_column":
    values, scale = kernel  # int8 [N, K], float32 [1, N]
    quantized, row_scale = keras.quantizers.abs_max_quantize(rows, axis=-1)
    sums = tf.linalg.matmul(values, quantized, transpose_b=True, output_type=tf.int32)
    return tf.cast(tf.transpose(sums), tf.float32) * (scale / row_scale)
  assert isinstance(kernel, precisions.Kernel)
  return kernel.matmul(rows)


def _kernels(kind, count, k, n, rng):
  import numpy as np
  import tensorflow as tf

  from tf_transformer.layers import precisions
  kernels = []
  for index in range(count):
    w = rng.normal(scale=0.05, size=(k, n)).astype(np.float32)
    if kind in ("float32", "split_rows", "multiply_reduce"):
      kernels.append(tf.constant(w))
    elif kind == "row_blocks":
      kernels.append(tf.constant(w.reshape(k, _BLOCKS, n // _BLOCKS).transpose(1, 0, 2).copy()))
    elif kind == "float32_transposed":
      kernels.append(tf.constant(w.T.copy()))
    elif kind in ("bfloat16", "int8"):
      kernels.append(precisions.PRECISIONS[kind].from_matrix(w, f"k{index}"))
    else:
      low = precisions.Int8Kernel.from_matrix(w, f"k{index}")
      values = tf.transpose(low.values) if kind == "int8_by_column" else low.values
      kernels.append((values, low.scale))
  return kernels


def main(argv):
  import time

  import numpy as np
  import tensorflow as tf

  k, n = (int(x) for x in FLAGS.shape.split("x"))
  count = max(2, int(np.ceil(FLAGS.set_mb * 1e6 / (k * n * 4))))
  iterations = max(3, 400 // count)
  rng = np.random.default_rng(0)
  start_rows = tf.constant(rng.normal(size=(FLAGS.rows, k)).astype(np.float32))
  for kind in FLAGS.kinds:
    kernels = _kernels(kind, count, k, n, rng)

    @tf.function(jit_compile=FLAGS.jit)
    def run(rows, kernels=kernels, kind=kind):
      def body(i, rows):
        for kernel in kernels:  # each product depends on the last: they run one after another
          rows += 1e-9 * tf.reduce_mean(_product(kind, rows, kernel))
        return i + 1, rows
      return tf.while_loop(lambda i, _: i < iterations, body, (0, rows))[1]

    run(start_rows).numpy()  # compiles
    best = float("inf")
    for _ in range(3):
      began = time.perf_counter()
      run(start_rows).numpy()
      best = min(best, time.perf_counter() - began)
    per_product = best / iterations / count
    print(f"M={FLAGS.rows} K={k} N={n} {kind:20s} {per_product * 1e6:8.1f} us, "
          f"{k * n * 4 / per_product / 1e9:5.1f} GB/s of float32 kernel", flush=True)


if __name__ == "__main__":
  app.run(main)
