"""Training throughput of the real train step on synthetic batches (a benchmark, not a test).

    python -m bench.train_speed --flagfile=flags/small.cfg [--repeats 3]

Source and target lengths (EOS included) are uniform in [--min_len, --max_len]; pairs go
through the project's own length bucketing, with --batch_tokens calibrated so that a batch
holds about --target_tokens real target tokens (as the peer script packs ~4096). Batches are
cached in memory before the clock starts; untimed warm-up: one batch of every shape (each
compiles once under --jit_compile), then --warmup steps. The training flags that change the
step apply: --skip_padding, --mixed_precision, --jit_compile, --update_freq. The last
line is one JSON object with at least `tgt_tok_per_s` and `peak_rss_mib`. Compare with
../shared/bench/peers/torch_train.py run alternately on the same machine.
"""

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import app, flags

from bench import op_profile
from tf_transformer import config
from tf_transformer.bin import shared_flags  # (defines the model flags)

flags.DEFINE_integer("steps", 10, "Timed steps.")
flags.DEFINE_integer("warmup", 3, "Untimed warm-up steps.")
flags.DEFINE_integer("target_tokens", 4096, "Real target tokens per batch to aim for.")
flags.DEFINE_integer("min_len", 5, "Shortest sentence (tokens with EOS).")
flags.DEFINE_integer("max_len", 40, "Longest sentence (tokens with EOS).")
flags.DEFINE_integer("repeats", 1, "Measurements, each in a fresh subprocess; prints medians.")
flags.DEFINE_string("profile_dir", "", "Trace the timed steps there and print time by op type.")
FLAGS = flags.FLAGS


def _synthetic_pairs(num_pairs, vocab_size, rng):
  import numpy as np
  import tensorflow as tf
  from data_pipeline.token_ids import EOS_ID, PAD_ID

  def side():
    lengths = rng.integers(FLAGS.min_len, FLAGS.max_len + 1, num_pairs)
    ids = rng.integers(EOS_ID + 1, vocab_size, int(lengths.sum())).astype("int32")
    ids[np.cumsum(lengths) - 1] = EOS_ID
    rows = tf.RaggedTensor.from_row_lengths(ids, lengths)
    return rows.to_tensor(PAD_ID, shape=[num_pairs, FLAGS.max_len]), lengths.astype("int32")

  (source, source_lengths), (target, target_lengths) = side(), side()
  # the rows of pipeline.tokenize_pairs: one width, and the longer side's length
  return tf.data.Dataset.from_tensor_slices(
      (source, target, np.maximum(source_lengths, target_lengths)))


def _batches(pairs, batch_tokens):
  from data_pipeline import bucketing, pipeline
  return (pairs.apply(bucketing.bucket_by_length(FLAGS.max_len, batch_tokens))
          .map(pipeline.add_decoder_inputs))


def _real_target_tokens(batch):
  return int((batch[2].numpy() != 0).sum())


def run_once() -> dict:
  import numpy as np
  import tensorflow as tf

  from tf_transformer import runtime
  from tf_transformer.training import run
  from tf_transformer.training.train_step import make_train_step

  train_config = config.TrainConfig(model_dir="", seed=FLAGS.seed,
                                    label_smoothing=FLAGS.label_smoothing,
                                    warmup_steps=FLAGS.warmup_steps,
                                    mixed_precision=FLAGS.mixed_precision,
                                    jit_compile=FLAGS.jit_compile, update_freq=FLAGS.update_freq)
  strategy = runtime.set_up_runtime(train_config)
  train_config = runtime.resolve_precision(train_config, strategy)
  rng = np.random.default_rng(FLAGS.seed)
  steps = FLAGS.warmup + FLAGS.steps * FLAGS.update_freq
  mean_len = (FLAGS.min_len + FLAGS.max_len) / 2
  pairs = _synthetic_pairs(int((steps + 8) * FLAGS.target_tokens / mean_len * 1.6),
                           FLAGS.vocab_size, rng)
  # calibrate: batch_tokens counts padding; aim the real target tokens at --target_tokens
  probe = list(_batches(pairs, FLAGS.target_tokens).take(20))
  real = statistics.mean(_real_target_tokens(b) for b in probe)
  batch_tokens = int(FLAGS.target_tokens * FLAGS.target_tokens / real)
  batches = [b for b in _batches(pairs.shuffle(10**6, seed=FLAGS.seed), batch_tokens)]
  batches = [b for b in batches if _real_target_tokens(b) > 0.8 * FLAGS.target_tokens][:steps]
  if len(batches) < steps:
    raise SystemExit(f"only {len(batches)} full batches; lower --steps")
  one_per_shape = list({tuple(b[0].shape): b for b in batches}.values())
  warm_up = one_per_shape + batches[:FLAGS.warmup]
  timed = batches[FLAGS.warmup:]

  model_config = shared_flags.model_config_from_flags(FLAGS.vocab_size, FLAGS.vocab_size)
  model, optimizer = run.create_model(model_config, train_config, strategy)
  dataset = tf.data.Dataset.from_generator(
      lambda: iter(warm_up + timed), output_signature=(tf.TensorSpec([None, None], tf.int32),) * 3)
  iterator = iter(dataset)
  train_step = make_train_step(model, optimizer, strategy, FLAGS.label_smoothing,
                               FLAGS.update_freq, FLAGS.jit_compile)
  update_freq = FLAGS.update_freq
  for _ in range(len(warm_up) // update_freq):
    train_step(iterator)
  for _ in range(len(warm_up) % update_freq):
    next(iterator)  # the timed steps start on a fresh group of batches
  step_times, tokens = [], 0
  padded = sum(int(tf.size(batch[2])) for batch in timed)
  profile = op_profile.traced(FLAGS.profile_dir) if FLAGS.profile_dir else contextlib.nullcontext()
  with profile:
    start = time.perf_counter()
    for _ in range(FLAGS.steps):
      t0 = time.perf_counter()
      stats = train_step(iterator)
      loss = float(stats["loss"] / stats["tokens"])
      step_times.append(time.perf_counter() - t0)
      tokens += int(stats["tokens"])
    elapsed = time.perf_counter() - start
  if FLAGS.profile_dir:
    print(op_profile.table(FLAGS.profile_dir), file=sys.stderr)
  return {
      "framework": "tf_transformer", "tensorflow": tf.__version__,
      "params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
      "skip_padding": FLAGS.skip_padding, "mixed_precision": train_config.mixed_precision,
      "jit_compile": FLAGS.jit_compile, "update_freq": FLAGS.update_freq,
      "batch_tokens": batch_tokens,
      "steps": FLAGS.steps, "warmup": FLAGS.warmup, "elapsed_s": elapsed,
      "tgt_tokens": tokens, "tgt_tokens_padded": padded,
      "tgt_tok_per_s": tokens / elapsed, "tgt_tok_per_batch": tokens / FLAGS.steps,
      "step_s_median": statistics.median(step_times), "last_loss": loss,
      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
  }


def main(argv):
  if FLAGS.repeats <= 1:
    print(json.dumps(run_once()))
    return
  child = [sys.executable, os.path.abspath(__file__)] + [
      a for a in argv[1:]] + [a for a in sys.argv[1:] if not a.startswith("--repeats")] + [
          "--repeats=1"]
  runs = []
  for i in range(FLAGS.repeats):
    out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
    runs.append(json.loads(out.strip().splitlines()[-1]))
    r = runs[-1]
    print(f"run {i + 1}/{FLAGS.repeats}: {r['tgt_tok_per_s']:.1f} tgt tok/s, "
          f"{r['step_s_median']:.3f} s/step, peak RSS {r['peak_rss_mib']:.0f} MiB, "
          f"{r['tgt_tok_per_batch']:.0f} tgt tok/batch", flush=True)
  summary = {key: statistics.median(r[key] for r in runs)
             for key in ("tgt_tok_per_s", "step_s_median", "peak_rss_mib")}
  print(json.dumps({"runs": runs, **summary}))


if __name__ == "__main__":
  app.run(main)
