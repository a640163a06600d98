"""Corpora, tokenization and tf.data input pipelines.

The bottom package: it imports nothing from tf_transformer or export, and every other package
imports it first, so TensorFlow's environment is set here, before TensorFlow loads.
"""

import os

# TensorFlow's C++ INFO/WARNING lines drown the progress bar; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF's default CPU allocator hands large buffers back to the kernel, which zeroes fresh pages
# on every step (a third of a CPU step's time); its BFC allocator keeps and reuses them.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
