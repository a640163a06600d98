"""Corpora, tokenization and tf.data input pipelines."""

import tf_transformer  # noqa: F401  (sets TensorFlow's environment before TensorFlow loads)
