"""Trains a Transformer: `python -m tf_transformer.train --flagfile=flags/<preset>.cfg`.

Trains (or resumes) a model in --model_dir, keeps its best checkpoint by dev BLEU and scores it
on --test_prefix; Ctrl-C saves a checkpoint and exits. With --init_from=OLD (a model directory;
--checkpoint picks its weights) a new run starts from OLD's weights, architecture and subword
model(s): fine-tuning (tf_transformer/training/fine_tuning.py); with --update_vocab, subword
models of its own. `--helpfull` lists every flag.
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

flags.DEFINE_bool("update_vocab", False,
                  "With --init_from: train subword models of the new run's own on the new data "
                  "(--vocab_size, --spm_model_type, ...) instead of keeping the old model's; "
                  "a piece of both vocabularies keeps its embedding and output row, a new one "
                  "starts from the mean of the old ones.")

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
    if FLAGS.update_vocab and not FLAGS.init_from:
      raise cli.FlagError("--update_vocab needs --init_from (the model whose weights the new "
                          "vocabulary takes over)")
    origin = fine_tuning.origin(train_config.model_dir, FLAGS.init_from)
    first_run = bool(FLAGS.init_from) and origin == FLAGS.init_from
    # read at the first run only, as --init_from: a resumed run has its own vocabulary already
    update_vocab = FLAGS.update_vocab and first_run
    if origin:
      given = {name: FLAGS[name].value for name in fine_tuning.ARCHITECTURE
               + fine_tuning.VOCABULARY if FLAGS[name].present}
      data_config = fine_tuning.check_settings(origin, given, data_config, update_vocab)
    if FLAGS.init_from and not first_run:
      logging.info("resuming %s: --init_from is read at the first run only",
                   train_config.model_dir)
    strategy = runtime.set_up_runtime(train_config)
    is_chief = runtime.worker_info(strategy)[2]
    if is_chief:
      model_dir.ensure_directory(train_config.model_dir)
      if first_run and not update_vocab:
        fine_tuning.copy_vocabulary(FLAGS.init_from, train_config.model_dir, data_config)
      model_dir.check_data(train_config.model_dir, data_config)
    else:
      # the chief trains the subword model(s); the other workers must use the same ones
      wait_for_vocabulary(train_config.model_dir, data_config)
    data = open_data(data_config, train_config.model_dir)
    start = None
    if origin:
      model_config = fine_tuning.model_config(origin, shared_flags.model_settings_from_flags(),
                                              data.vocabulary if update_vocab else None)
      if first_run:
        start = fine_tuning.start(FLAGS.init_from, FLAGS.checkpoint, train_config.model_dir,
                                  record=is_chief, update_vocab=update_vocab,
                                  src_lang=data_config.src_lang, tgt_lang=data_config.tgt_lang)
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
