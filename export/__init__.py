"""SavedModel export for TF Serving: string in, string out."""

import data_pipeline  # noqa: F401  (sets TensorFlow's environment before TensorFlow loads)
