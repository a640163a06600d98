"""Trains a Transformer: `python -m tf_transformer.train --flagfile=flags/<preset>.cfg`.

Kept short on purpose: the logic lives in importable, tested modules.
"""

import json
import logging as std_logging
import os
import sys

from absl import app, logging

from tf_transformer import config


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = tuple(os.path.join(_ROOT, name) + os.sep
                  for name in ("tf_transformer", "data_pipeline", "export"))


def _own_info_only(record) -> bool:
  """Keeps this project's INFO lines and everyone's warnings (TF logs INFO chatter via absl)."""
  return record.levelno >= std_logging.WARNING or record.pathname.startswith(_PACKAGES)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  # imported here so that --help and flag errors answer before TensorFlow loads
  from data_pipeline.corpora import CorpusError
  from data_pipeline.parallel_data import ParallelData
  from tf_transformer import trainer

  logging.set_verbosity(logging.INFO)
  std_logging.getLogger("absl").addFilter(_own_info_only)
  try:
    data_config = config.data_config_from_flags()
    train_config = config.train_config_from_flags()
    strategy = trainer.set_up_runtime(train_config)
    data = ParallelData(data_config, train_config.model_dir)
    model_config = config.model_config_from_flags(data.vocabulary.source_size,
                                                   data.vocabulary.target_size)
    results = trainer.Trainer(data, model_config, train_config, strategy).train()
  except (config.FlagError, CorpusError, trainer.TrainingError) as e:
    sys.exit(f"error: {e}")
  except trainer.TrainingInterrupted as e:
    print(f"\n{e}", file=sys.stderr)
    sys.exit(130)
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
