"""The benchmarks whose figures docs/ reports, run from the repository root as
`python -m bench.<name>` (kernels/: one layer against Keras's; studies/: one-off measurements
whose result is recorded; peers/: scripts for the peer systems' environment). Never run by the
tests.

Importing the package sets TensorFlow's environment as the tools do, before a benchmark loads
TensorFlow: the figures are of the product as it runs.
"""

from tf_transformer.bin import cli

cli.set_tensorflow_environment()
