"""SavedModel export for TF Serving: string in, string out."""

import tf_transformer  # noqa: F401  (sets TensorFlow's environment before TensorFlow loads)
