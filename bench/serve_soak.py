"""Serving under load: client threads calling an exported SavedModel's serving_default, one
sentence per request, beside CTranslate2 serving the same weights (a benchmark).

    # a trained model on real sentences, 1, 4 and 8 clients, the SavedModel then CTranslate2:
    python -m bench.serve_soak --flagfile=flags/multi30k_en_de.cfg \\
        --model_dir=models/multi30k_en_de --sentences=../shared/data/multi30k/val.en.gz \\
        --clients=1,4,8 --minutes=1 --ct2=float32,int8 [--precision=int8] [--shortlist_size=1024]
    # a random model (every output runs to the length limit, the heaviest case), 10 minutes:
    python -m bench.serve_soak --flagfile=flags/small.cfg --clients=8 --minutes=10

With --model_dir, its --checkpoint is exported as tf_transformer.bin.export_saved_model does
it (XLA-compiled beam search, --beam_size, --extra_decode_length, --precision,
--shortlist_size), and with --ct2 also as tf_transformer.bin.export_ctranslate2 does it, loaded
in each of those compute types (its SentencePiece model applied in Python, as a CTranslate2
server does). Without it, a randomly initialised model of the preset's dims is exported.
Requests are the lines of --sentences (random words without it, 5% of them empty). For each
number of --clients, the clients send requests for --minutes to the SavedModel, then to each
CTranslate2 translator (inter_threads = min(clients, cores), one thread each: the faster
setting of CTranslate2's int8 at one sentence per call). Prints requests/s and p50/p99 latency
per (system, clients), and the process RSS of the SavedModel runs; the last line is JSON.
"""

import json
import os
import random
import shutil
import statistics
import threading
import time

from absl import app, flags

from bench import decode_speed  # (defines --workdir; its subword model)
from tf_transformer.bin import shared_flags  # (defines the model and decoding flags)
from tf_transformer.bin import export_saved_model  # (defines --precision and --batching)

flags.DEFINE_float("minutes", 10.0, "How long to send requests, per system and client count.")
flags.DEFINE_list("clients", ["8"], "Numbers of concurrent clients, one run each.")
flags.DEFINE_string("sentences", None, "Source sentences, one per line (.gz read too).")
flags.DEFINE_list("ct2", [], "CTranslate2 compute types to serve the same weights with "
                  "(float32, int8); needs --model_dir.")
flags.DEFINE_integer("ct2_intra_threads", 1, "CTranslate2's threads per translation "
                     "(intra_threads); inter_threads is min(clients, cores).", lower_bound=1)
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
  from tf_transformer.config import DecodeConfig
  from tf_transformer.translator import Translator

  rng = np.random.default_rng(FLAGS.seed)
  os.makedirs(FLAGS.workdir, exist_ok=True)
  vocabulary = decode_speed._subword_model(os.path.join(FLAGS.workdir, "spm.model"),
                                           FLAGS.vocab_size, rng)
  model_config = shared_flags.model_config_from_flags(vocabulary.source_size,
                                                      vocabulary.target_size)
  search = DecodeConfig(beam_size=FLAGS.beam_size, max_source_length=FLAGS.max_length,
                        extra_decode_length=FLAGS.extra_decode_length, decode_jit=True)
  module = Translator(build_model(model_config), vocabulary, search, precision=FLAGS.precision,
                      batching=export_saved_model.batching_config_from_flags())
  from export import serving

  export_dir = os.path.join(FLAGS.workdir, "soak_export")
  shutil.rmtree(export_dir, ignore_errors=True)
  return serving.save_version(module, module.signatures(), export_dir, 1, {},
                              module.batching.value)


def _trained_export():
  """--model_dir exported to a fresh folder under --workdir; returns the version folder."""
  import dataclasses

  from export import serving

  export_dir = os.path.join(FLAGS.workdir, "soak_trained_export")
  shutil.rmtree(export_dir, ignore_errors=True)
  decode_config = dataclasses.replace(shared_flags.decode_config_from_flags(), decode_jit=True)
  data_config = shared_flags.data_config_from_flags() if FLAGS.shortlist_size else None
  return serving.export(FLAGS.model_dir, FLAGS.src_lang, FLAGS.tgt_lang, export_dir,
                        decode_config, FLAGS.checkpoint, FLAGS.precision, FLAGS.shortlist_size,
                        FLAGS.shortlist_per_source, data_config,
                        batching=export_saved_model.batching_config_from_flags())


def _ct2_translate_fns(clients: int):
  """{"ct2_<compute type>": fn(text) -> text} over --model_dir exported to CTranslate2."""
  import ctranslate2
  import sentencepiece

  from export import ctranslate2 as ct2_export

  folder = os.path.join(FLAGS.workdir, "soak_ct2")
  if not os.path.isdir(folder):
    ct2_export.export(FLAGS.model_dir, FLAGS.src_lang, FLAGS.tgt_lang, folder,
                      checkpoint=FLAGS.checkpoint)
  models = sorted(name for name in os.listdir(folder) if name.startswith("spm."))
  source = next((m for m in models if m in ("spm.joint.model", f"spm.{FLAGS.src_lang}.model")))
  target = next((m for m in models if m in ("spm.joint.model", f"spm.{FLAGS.tgt_lang}.model")))
  source = sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, source))
  target = sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, target))
  # one thread per translation: at one sentence per call, CTranslate2's int8 (its fastest
  # compute type there) runs 9x faster on one thread than on two (docs/speed.md)
  inter = max(1, min(clients, os.cpu_count() or 1))
  fns = {}
  for compute_type in FLAGS.ct2:
    translator = ctranslate2.Translator(folder, device="cpu", compute_type=compute_type,
                                        inter_threads=inter,
                                        intra_threads=FLAGS.ct2_intra_threads)

    def translate(text, translator=translator):
      pieces = source.encode(text, out_type=str)[:FLAGS.max_length]
      if not pieces:
        return ""
      result = translator.translate_batch(
          [pieces], beam_size=FLAGS.beam_size, length_penalty=FLAGS.alpha,
          max_decoding_length=len(pieces) + 1 + FLAGS.extra_decode_length)
      return target.decode(result[0].hypotheses[0])

    fns[f"ct2_{compute_type}"] = translate
  return fns


def _sentences():
  """The requests: --sentences' lines, or random words (5% empty)."""
  if FLAGS.sentences:
    import gzip
    opener = gzip.open if FLAGS.sentences.endswith(".gz") else open
    with opener(FLAGS.sentences, "rt", encoding="utf-8") as lines:
      return [line.rstrip("\n") for line in lines]
  words = [f"w{'abcdefghij'[i % 10]}{i}" for i in range(2000)]
  rng = random.Random(FLAGS.seed)
  return ["" if rng.random() < 0.05 else
          " ".join(rng.choice(words) for _ in range(rng.randint(1, 100))) for _ in range(2000)]


def _soak(translate, sentences, clients: int) -> dict:
  """`clients` threads calling translate(text) on random `sentences` for --minutes."""
  latencies, errors, lock = [], [], threading.Lock()
  start = time.perf_counter()
  end = start + FLAGS.minutes * 60

  def client(index):
    rng = random.Random(index)
    while time.perf_counter() < end:
      text = rng.choice(sentences)
      began = time.perf_counter()
      try:
        translate(text)
      except Exception as e:  # a soak counts every failure, of any kind
        with lock:
          errors.append(f"{type(e).__name__}: {str(e)[:200]}")
        continue
      with lock:
        latencies.append(time.perf_counter() - began)

  threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
  for thread in threads:
    thread.start()
  time.sleep(max(0.0, start + FLAGS.minutes * 30 - time.perf_counter()))
  rss_middle = _rss_mib()
  for thread in threads:
    thread.join()
  elapsed = time.perf_counter() - start
  ordered = sorted(latencies) or [float("nan")]
  return {"clients": clients, "requests": len(latencies),
          "requests_per_s": len(latencies) / elapsed,
          "p50_ms": 1000 * statistics.median(ordered),
          "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
          "errors": len(errors), "first_errors": errors[:3],
          "rss_mib_middle": rss_middle, "rss_mib_end": _rss_mib()}


def main(argv):
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

  if FLAGS.ct2 and not FLAGS.model_dir:
    raise app.UsageError("--ct2 needs --model_dir (the weights CTranslate2 serves)")
  from tf_transformer import inference

  folder = _trained_export() if FLAGS.model_dir else _random_export(tf)
  loaded = tf.saved_model.load(folder)
  serve = loaded.signatures["serving_default"]
  if FLAGS.batching:  # as TF Serving at load: each merged batch size compiles
    inference.replay_warmup_requests(folder, loaded)
  sentences = _sentences()
  # every shape bucket of one sentence compiles before the clock: a spread of lengths
  for text in sorted(set(sentences), key=len)[::max(1, len(set(sentences)) // 100)]:
    serve(inputs=tf.constant([text]))
  rss_start = _rss_mib()

  def saved_model(text):
    return serve(inputs=tf.constant([text]))["outputs"].numpy()

  report = []
  for clients in (int(c) for c in FLAGS.clients):
    ours = f"saved_model_{FLAGS.precision}" + (f"_shortlist{FLAGS.shortlist_size}"
                                               if FLAGS.shortlist_size else "") + (
                                                   "_batching" if FLAGS.batching else "")
    systems = {ours: saved_model}
    if FLAGS.ct2:
      systems.update(_ct2_translate_fns(clients))
    for name, translate in systems.items():
      translate(sentences[0])  # a CTranslate2 translator's first call loads it
      result = dict(_soak(translate, sentences, clients), system=name, rss_mib_start=rss_start)
      report.append(result)
      print(f"{name:20s} {clients} clients: {result['requests']} requests, "
            f"{result['requests_per_s']:.2f}/s, p50 {result['p50_ms']:.0f} ms, p99 "
            f"{result['p99_ms']:.0f} ms, {result['errors']} errors; RSS {rss_start:.0f} / "
            f"{result['rss_mib_middle']:.0f} / {result['rss_mib_end']:.0f} MiB (start / middle "
            f"/ end)", flush=True)
  print(json.dumps({"minutes": FLAGS.minutes, "model_dir": FLAGS.model_dir,
                    "sentences": FLAGS.sentences, "beam_size": FLAGS.beam_size,
                    "results": report}))


if __name__ == "__main__":
  app.run(main)
