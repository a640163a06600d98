"""Trains a Transformer: `python -m tf_transformer.train --flagfile=flags/<preset>.cfg`.

Trains (or resumes) a model in --model_dir, keeps its best checkpoint by dev BLEU and scores it
on --test_prefix; Ctrl-C saves a checkpoint and exits. `--helpfull` lists every flag.
"""

import json
import sys

from tf_transformer import config
from tf_transformer.bin import cli


def main(argv):
  cli.start(argv)
  from data_pipeline.parallel_data import open_data
  from data_pipeline.tokenizer import wait_for_vocabulary
  from tf_transformer import model_dir, runtime, trainer

  try:
    data_config = config.data_config_from_flags()
    train_config = config.train_config_from_flags()
    decode_config = config.decode_config_from_flags()
    strategy = runtime.set_up_runtime(train_config)
    if runtime.worker_info(strategy)[2]:
      model_dir.ensure_directory(train_config.model_dir)
      model_dir.check_data(train_config.model_dir, data_config)
    else:
      # the chief trains the subword model(s); the other workers must use the same ones
      wait_for_vocabulary(train_config.model_dir, data_config)
    data = open_data(data_config, train_config.model_dir)
    model_config = config.model_config_from_flags(data.vocabulary.source_size,
                                                   data.vocabulary.target_size)
    results = trainer.create_trainer(data, model_config, train_config, decode_config,
                                     strategy).train()
  except trainer.TrainingInterrupted as e:
    print(f"\n{e}", file=sys.stderr)
    sys.exit(130)
  print(json.dumps(results))


def run():
  cli.run(main)


if __name__ == "__main__":
  run()
