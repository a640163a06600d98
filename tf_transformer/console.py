"""What the command-line tools print: this project's INFO lines, everyone's warnings."""

import logging as std_logging
import os

from absl import app, logging

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = tuple(os.path.join(_ROOT, name) + os.sep
                  for name in ("tf_transformer", "data_pipeline", "export"))


def _own_info_only(record) -> bool:
  """TensorFlow logs INFO chatter (checkpoint sharding, asset writing) through absl too."""
  return record.levelno >= std_logging.WARNING or record.pathname.startswith(_PACKAGES)


def start(argv):
  """What every CLI's main does first: refuse stray arguments, set up logging."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.INFO)
  std_logging.getLogger("absl").addFilter(_own_info_only)
