"""Keras's layer against ours, forward and backward, timed alternately in one process.

Used by `dropout_speed.py`, `layer_norm_speed.py` and `matmul_grad_speed.py`: each passes
two tf.functions computing a layer's forward and backward pass; they run in turn `repeats`
times after one warm-up call.
"""

import json
import statistics
import time


def race(runs: dict, args: tuple, repeats: int, shape) -> dict:
  """runs: {"keras": fn, "tf_transformer": fn}, each fn(*args) returning a list of tensors.

  Prints the median milliseconds of each, their ratio and one JSON line; returns the medians.
  """
  times = {name: [] for name in runs}
  for run in runs.values():
    run(*args)[0].numpy()  # trace and warm up
  for _ in range(repeats):
    for name, run in runs.items():
      start = time.perf_counter()
      run(*args)[0].numpy()
      times[name].append(1000 * (time.perf_counter() - start))
  medians = {name: statistics.median(values) for name, values in times.items()}
  for name, value in medians.items():
    print(f"{name:>15}: {value:.2f} ms (forward + backward, median of {repeats})")
  print(f"keras / ours: {medians['keras'] / medians['tf_transformer']:.2f}x")
  print(json.dumps({"shape": list(shape), "median_ms": medians}))
  return medians
