"""Exports a trained model for TF Serving: `python -m tf_transformer.bin.export_saved_model
--flagfile=flags/<preset>.cfg --export_dir=exports/<name>`.

Writes `exports/<name>/<version>/` (version = the checkpoint step, or the next free number)
with the signatures serving_default, translate_nbest, score and align, and TF Serving warm-up
requests for each, and `exports/<name>/batching_parameters.txt` unless one is there. The export
dir may be any TensorFlow file system path (gs://...). The search is XLA-compiled unless
--nodecode_jit (TF Serving then needs --xla_cpu_compilation_enabled=true on CPU).
--precision=int8 or bfloat16 stores the matrices of the model's products in 8 or 16 bits
(tf_transformer/layers/precisions.py): faster decoding, a small BLEU cost (docs/serving.md).
--shortlist_size=N has every search write only N target pieces of each sentence's own,
chosen from a lexicon counted over the training data of the data flags (docs/serving.md).
--batching merges the requests of concurrent callers into one search in-graph, in any runtime
that loads the export (docs/serving.md, "Concurrent requests"). --signatures=serving_default,score
serves those only: a smaller export that saves, loads and serves in less time and memory.
"""

from absl import flags

from tf_transformer import config
from tf_transformer.bin import cli, shared_flags
from tf_transformer.bin.cli import FlagError

flags.DEFINE_string("export_dir", None, "The model's folder in a TF Serving model base path.")
flags.DEFINE_enum("precision", "float32", list(config.CHOICES["precision"]),
                  "Weights of the matrix products: float32 (exact), bfloat16, or int8 (per-column "
                  "scales, rows quantised as they are multiplied).")

flags.DEFINE_integer("shortlist_size", 0,
                     "Search each sentence over a vocabulary shortlist of its own, this many "
                     "target pieces (as Marian's lexical shortlists): EOS, the training data's "
                     "best target pieces for its source pieces, then the most frequent ones; "
                     "the output projection shrinks to them. 0: the whole vocabulary, as is any "
                     "size >= the target vocabulary's. Counted over the training data of "
                     "--data_dir (or --dataset) and --train_prefix; `score` always uses the "
                     "whole vocabulary.")
flags.register_validator("shortlist_size", lambda value: value == 0 or value >= 2,
                         message="must be 0 (no shortlist) or an integer >= 2")
flags.DEFINE_integer("shortlist_per_source", 20,
                     "With --shortlist_size: the target pieces a source piece brings into the "
                     "shortlist (its best by Dice coefficient over the training pairs).",
                     lower_bound=1)

flags.DEFINE_boolean("batching", False,
                     "Merge the requests of concurrent callers of serving_default, "
                     "translate_nbest, translate_prefix, sample, sample_prefix and score into one "
                     "search, in-graph (TensorFlow's BatchFunction op), whatever runtime loads the "
                     "export. Not with TF Serving's --enable_batching.")


def _define_batching_setting(field: str, help_text: str):
  """An integer flag for config.BatchingConfig's `field` (named as cli.FLAG_OF_FIELD says),
  with its default and bounds."""
  flags.DEFINE_integer(cli.FLAG_OF_FIELD[field], getattr(config.BatchingConfig, field),
                       f"With --batching: {help_text}", lower_bound=config.INTEGER_RANGES[field][0])


_define_batching_setting("max_batch_size",
                         "the most rows of a merged batch; a larger request runs alone.")
flags.DEFINE_list("batching_allowed_sizes", [],
                  "With --batching: the batch sizes a merged batch is padded up to, one XLA "
                  "compilation each, made at load; the last must be --batching_max_size. "
                  "Default: the powers of two below it, and it.")
_define_batching_setting("batch_timeout_micros",
                         "how long a batch waits for more requests while a batch thread is free "
                         "(requests that come while every thread is busy join the next batch "
                         "anyway).")
_define_batching_setting("num_batch_threads", "the merged batches decoded side by side.")
_define_batching_setting("max_enqueued_batches",
                         "the batches that may wait for a thread; beyond them a request fails "
                         "at once instead of queueing.")

flags.DEFINE_list("signatures", [],
                  "Serve only these signatures, comma-separated (default: all those of "
                  "docs/serving.md). Each one left out saves its tracing at export, and its "
                  "functions' time and memory at load.")

FLAGS = flags.FLAGS
_BATCHING_SETTINGS = tuple(cli.FLAG_OF_FIELD.values())


def batching_config_from_flags():
  """--batching's config.BatchingConfig, or None without --batching."""
  if not FLAGS.batching:
    for name in _BATCHING_SETTINGS:
      if FLAGS[name].present:
        raise FlagError(f"--{name} needs --batching")
    return None
  try:
    sizes = tuple(int(size) for size in FLAGS.batching_allowed_sizes)
  except ValueError:
    raise FlagError(f"--batching_allowed_sizes={','.join(FLAGS.batching_allowed_sizes)} must "
                    "be integers") from None
  try:
    return config.BatchingConfig(
        max_batch_size=FLAGS.batching_max_size, allowed_batch_sizes=sizes,
        batch_timeout_micros=FLAGS.batching_timeout_micros,
        num_batch_threads=FLAGS.batching_threads,
        max_enqueued_batches=FLAGS.batching_max_enqueued)
  except config.ConfigError:
    raise FlagError(f"--batching_allowed_sizes={','.join(FLAGS.batching_allowed_sizes)} must be "
                    "increasing positive integers ending with "
                    f"--batching_max_size={FLAGS.batching_max_size}") from None


def main(argv):
  cli.start(argv)
  import export
  from export import saved_model
  from tf_transformer.serving import signatures

  members, weights = shared_flags.ensemble_from_flags()
  if not (members or FLAGS.model_dir):
    raise FlagError("--model_dir is required (or --ensemble: the model directories of an "
                    "ensemble)")
  data_config = shared_flags.data_config_from_flags() if FLAGS.shortlist_size else None
  batching = batching_config_from_flags()
  try:
    names = signatures.chosen(tuple(FLAGS.signatures))
  except ValueError as e:
    raise FlagError(f"--signatures={','.join(FLAGS.signatures)}: {e}") from None
  options = saved_model.Options(
      FLAGS.src_lang, FLAGS.tgt_lang, shared_flags.decode_config_from_flags(for_export=True),
      FLAGS.checkpoint,
      FLAGS.precision, FLAGS.shortlist_size, FLAGS.shortlist_per_source, data_config,
      tuple(weights), batching, names)
  print(export.exporter("saved_model")(members or FLAGS.model_dir, FLAGS.export_dir, options))


def run():
  FLAGS.set_default("decode_jit", True)  # a server decodes for long: the compilations pay
  cli.run(main, required_flags=("export_dir",))


if __name__ == "__main__":
  run()
