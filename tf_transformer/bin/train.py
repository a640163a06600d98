"""Trains a Transformer: `python -m tf_transformer.train --flagfile=flags/<preset>.cfg`.

Trains (or resumes) a model in --model_dir, keeps its best checkpoint by dev BLEU and scores it
on --test_prefix; Ctrl-C saves a checkpoint and exits. With --init_from=OLD (a model directory;
--checkpoint picks its weights) a new run starts from OLD's weights, architecture and subword
model(s): fine-tuning (tf_transformer/training/fine_tuning.py). `--helpfull` lists every flag.
"""

import json
import sys

from absl import flags, logging

from tf_transformer.bin import cli, shared_flags

flags.DEFINE_string("init_from", None,
                    "Fine-tune: start a new --model_dir from this model directory's weights "
                    "(--checkpoint: best, latest, average, ema or a path), architecture and "
                    "subword model(s), with a fresh optimizer and step count. Read at the first "
                    "run only: a resumed run continues its own checkpoints.")

FLAGS = flags.FLAGS


def main(argv):
  cli.start(argv)
  from data_pipeline.parallel_data import open_data
  from data_pipeline.tokenizer import wait_for_vocabulary
  from tf_transformer.training import fine_tuning, run, trainer
  from tf_transformer import model_dir, runtime

  try:
    data_config = shared_flags.data_config_from_flags()
    train_config = shared_flags.train_config_from_flags()
    decode_config = shared_flags.decode_config_from_flags()
    origin = fine_tuning.origin(train_config.model_dir, FLAGS.init_from)
    first_run = bool(FLAGS.init_from) and origin == FLAGS.init_from
    if origin:
      given = {name: FLAGS[name].value for name in fine_tuning.ARCHITECTURE
               + fine_tuning.VOCABULARY if FLAGS[name].present}
      data_config = fine_tuning.check_settings(origin, given, data_config)
    if FLAGS.init_from and not first_run:
      logging.info("resuming %s: --init_from is read at the first run only",
                   train_config.model_dir)
    strategy = runtime.set_up_runtime(train_config)
    is_chief = runtime.worker_info(strategy)[2]
    if is_chief:
      model_dir.ensure_directory(train_config.model_dir)
      if first_run:
        fine_tuning.copy_vocabulary(FLAGS.init_from, train_config.model_dir, data_config)
      model_dir.check_data(train_config.model_dir, data_config)
    else:
      # the chief trains the subword model(s); the other workers must use the same ones
      wait_for_vocabulary(train_config.model_dir, data_config)
    data = open_data(data_config, train_config.model_dir)
    start = None
    if origin:
      model_config = fine_tuning.model_config(origin, shared_flags.model_settings_from_flags())
      if first_run:
        start = fine_tuning.start(FLAGS.init_from, FLAGS.checkpoint, train_config.model_dir,
                                  record=is_chief)
    else:
      model_config = shared_flags.model_config_from_flags(data.vocabulary.source_size,
                                                    data.vocabulary.target_size)
    results = run.create_trainer(data, model_config, train_config, decode_config, strategy,
                                 start).train()
  except trainer.TrainingInterrupted as e:
    print(f"\n{e}", file=sys.stderr)
    sys.exit(130)
  print(json.dumps(results))


def run():
  cli.run(main)


if __name__ == "__main__":
  run()
