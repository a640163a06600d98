"""tf-transformer: the Transformer of "Attention Is All You Need" for machine translation."""

import data_pipeline  # noqa: F401  (sets TensorFlow's environment before TensorFlow loads)
