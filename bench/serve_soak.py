"""Serving under load: threads calling an exported SavedModel's serving_default (a benchmark).

    python -m bench.serve_soak --flagfile=flags/small.cfg [--saved_model=DIR] [--minutes 10]

Without --saved_model, a randomly initialised model of the preset's dims is exported the way
tf_transformer.bin.export_saved_model does it (XLA-compiled beam search, --beam_size,
--extra_decode_length) and loaded back; a random model seldom ends a sentence early, so each output runs to the length
limit, the heaviest case. --threads threads each send one sentence per request, of 1 to 100
random words or empty, for --minutes. Prints requests/s, p50/p99 latency, errors, and the
process RSS at the start (after a warm-up), the middle and the end; the last line is JSON.
"""

import json
import os
import random
import statistics
import threading
import time

from absl import app, flags

from bench import decode_speed  # (defines --workdir; its subword model)
from tf_transformer import config  # (defines the model and decoding flags)

flags.DEFINE_float("minutes", 10.0, "How long to send requests.")
flags.DEFINE_integer("threads", 8, "Concurrent callers.")
FLAGS = flags.FLAGS


def _rss_mib() -> float:
  with open("/proc/self/status") as f:
    kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
  return kib / 1024


def _random_export(tf):
  """A random model of the preset's dims, exported like tf_transformer.bin.export_saved_model;
  returns its folder."""
  import numpy as np

  from tf_transformer.model import build_model
  from tf_transformer.translator import Translator

  rng = np.random.default_rng(FLAGS.seed)
  os.makedirs(FLAGS.workdir, exist_ok=True)
  vocabulary = decode_speed._subword_model(os.path.join(FLAGS.workdir, "spm.model"),
                                           FLAGS.vocab_size, rng)
  model_config = config.model_config_from_flags(vocabulary.source_size, vocabulary.target_size)
  model = build_model(model_config)
  module = Translator(model, vocabulary, beam_size=FLAGS.beam_size, nbest=1,
                      max_length=FLAGS.max_length, extra_decode_length=FLAGS.extra_decode_length,
                      decode_jit=True)
  folder = os.path.join(FLAGS.workdir, "soak_export")
  tf.saved_model.save(module, folder, signatures=module.signatures())
  return folder


def main(argv):
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

  folder = FLAGS.saved_model or _random_export(tf)
  serve = tf.saved_model.load(folder).signatures["serving_default"]
  words = [f"w{'abcdefghij'[i % 10]}{i}" for i in range(2000)]

  def sentence(rng):
    if rng.random() < 0.05:
      return ""
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 100)))

  for n in range(0, 101, 5):  # every shape bucket of one sentence compiles before the clock
    serve(inputs=tf.constant([" ".join(words[:n])]))
  rss = {"start": _rss_mib()}
  latencies, errors, lock = [], [], threading.Lock()
  start = time.perf_counter()
  end = start + FLAGS.minutes * 60

  def caller(index):
    rng = random.Random(index)
    while time.perf_counter() < end:
      text = sentence(rng)
      began = time.perf_counter()
      try:
        serve(inputs=tf.constant([text]))["outputs"].numpy()
      except Exception as e:  # a soak counts every failure, of any kind
        with lock:
          errors.append(f"{type(e).__name__}: {str(e)[:200]}")
        continue
      with lock:
        latencies.append(time.perf_counter() - began)

  threads = [threading.Thread(target=caller, args=(i,)) for i in range(FLAGS.threads)]
  for thread in threads:
    thread.start()
  time.sleep(max(0.0, start + FLAGS.minutes * 30 - time.perf_counter()))
  rss["middle"] = _rss_mib()
  for thread in threads:
    thread.join()
  rss["end"] = _rss_mib()
  elapsed = time.perf_counter() - start
  ordered = sorted(latencies) or [float("nan")]
  report = {"minutes": FLAGS.minutes, "threads": FLAGS.threads, "requests": len(latencies),
            "requests_per_s": len(latencies) / elapsed,
            "p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "errors": len(errors), "first_errors": errors[:3],
            "rss_mib": rss, "rss_growth_middle_to_end": rss["end"] / rss["middle"] - 1}
  print(f"{report['requests']} requests in {elapsed:.0f} s: {report['requests_per_s']:.2f}/s, "
        f"p50 {report['p50_ms']:.0f} ms, p99 {report['p99_ms']:.0f} ms, {len(errors)} errors; "
        f"RSS {rss['start']:.0f} / {rss['middle']:.0f} / {rss['end']:.0f} MiB (start / middle / "
        f"end, {100 * report['rss_growth_middle_to_end']:+.1f}% middle to end)", flush=True)
  print(json.dumps(report))


if __name__ == "__main__":
  app.run(main)
