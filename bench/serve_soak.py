"""Serving under load: client threads calling an exported SavedModel's serving_default, one
sentence per request, beside CTranslate2 serving the same weights (a benchmark).

    # a trained model on real sentences, 1 to 16 clients, three alternated rounds:
    python -m bench.serve_soak --flagfile=flags/multi30k_en_de.cfg \\
        --model_dir=models/multi30k_en_de --sentences=../shared/data/multi30k/val.en.gz \\
        --clients=1,4,8,16 --minutes=0.5 --rounds=3 --precision=int8 --shortlist_size=1024 \\
        --batching --also_unbatched --ct2=int8 --ct2_intra_threads=1,2
    # a random model of base dims, every output exactly 30 tokens in both engines:
    python -m bench.serve_soak --flagfile=flags/base.cfg --min_decode_length=30 \\
        --max_decode_length=30 --sentences=../shared/data/multi30k/val.en.gz --clients=1,8 \\
        --minutes=0.5 --batching --ct2=int8
    # a random model, random words (every output runs to the length limit), 10 minutes:
    python -m bench.serve_soak --flagfile=flags/small.cfg --clients=8 --minutes=10

With --model_dir, its --checkpoint is exported as tf_transformer.bin.export_saved_model does it
(the beam search XLA-compiled unless --nodecode_jit, --beam_size, --extra_decode_length,
--min_decode_length, --max_decode_length, --precision, --shortlist_size, --batching and its
settings), and with --ct2 also as tf_transformer.bin.export_ctranslate2 does it, loaded in each of
those compute types (its SentencePiece model applied in Python, as a CTranslate2 server does),
once per --ct2_intra_threads value. Without it, a randomly initialised model of the preset's dims
is exported to both. Requests are the lines of --sentences (random words without it, 5% of them
empty). For each number of --clients, each of --rounds runs every system in turn: the clients send
requests for --minutes. Prints requests/s and p50/p99 latency per (system, clients, round), then
the medians over the rounds, and the process RSS; the last line is JSON.
"""

import json
import os
import random
import shutil
import statistics
import threading
import time

from absl import flags

from bench import decode_speed  # (defines --workdir; its subword model)
from tf_transformer.bin import cli
from tf_transformer.bin import shared_flags  # (defines the model and decoding flags)
from tf_transformer.bin import export_saved_model  # (defines --precision and --batching)

flags.DEFINE_float("minutes", 10.0, "How long to send requests, per system and client count.")
flags.DEFINE_list("clients", ["8"], "Numbers of concurrent clients, one run each.")
flags.DEFINE_string("sentences", None, "Source sentences, one per line (.gz read too).")
flags.DEFINE_list("ct2", [], "CTranslate2 compute types to serve the same weights with "
                  "(float32, int8).")
flags.DEFINE_list("ct2_intra_threads", ["1"], "CTranslate2 set-ups, one per value: its threads "
                  "per translation (intra_threads); inter_threads (translations side by side) "
                  "is min(clients, cores // intra_threads), so no set-up oversubscribes the "
                  "cores.")
flags.DEFINE_integer("rounds", 1, "Rounds per client count: each round runs every system once, "
                     "in turn; the report gives each system's medians over the rounds.",
                     lower_bound=1)
flags.DEFINE_bool("also_unbatched", False, "With --batching, also serve the same weights "
                  "exported without it, alternated with the batching export (one client's "
                  "latency is the cost of the batching queue).")
flags.DEFINE_integer("intra_op_threads", 0, "TensorFlow's threads for one op (the XLA-compiled "
                     "search included), as TF Serving's --tensorflow_intra_op_parallelism; 0 is "
                     "TensorFlow's default (every core).", lower_bound=0)
flags.DEFINE_integer("inter_op_threads", 0, "TensorFlow's threads running ops side by side "
                     "(concurrent requests), as TF Serving's "
                     "--tensorflow_inter_op_parallelism; 0 is TensorFlow's default.",
                     lower_bound=0)
FLAGS = flags.FLAGS


def _rss_mib() -> float:
  with open("/proc/self/status") as f:
    kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
  return kib / 1024


def _random_model():
  """A random model of the preset's dims and its random subword vocabulary (tokenizer.Vocabulary),
  saved under --workdir."""
  import numpy as np

  from tf_transformer.model import build_model

  rng = np.random.default_rng(FLAGS.seed)
  os.makedirs(FLAGS.workdir, exist_ok=True)
  vocabulary = decode_speed._subword_model(os.path.join(FLAGS.workdir, "spm.model"),
                                           FLAGS.vocab_size, rng)
  model_config = shared_flags.model_config_from_flags(vocabulary.source_size,
                                                      vocabulary.target_size)
  return build_model(model_config), vocabulary


def _export(batching, random_model=None) -> str:
  """--model_dir (or `random_model`, a (model, vocabulary) pair) exported as
  tf_transformer.bin.export_saved_model does it, with in-graph `batching` (a BatchingConfig or
  None), to a fresh folder under --workdir; returns the version folder."""
  from export import saved_model
  from tf_transformer.serving import export_format

  export_dir = os.path.join(FLAGS.workdir, "soak_export" + ("_batching" if batching else ""))
  shutil.rmtree(export_dir, ignore_errors=True)
  search = shared_flags.decode_config_from_flags()
  if random_model:
    from tf_transformer.serving.translator import Translator

    module = Translator(random_model[0], random_model[1], search, precision=FLAGS.precision,
                        batching=batching)
    return export_format.save_version(module, module.signatures(), export_dir, 1, {},
                                      module.batching.value)
  data_config = shared_flags.data_config_from_flags() if FLAGS.shortlist_size else None
  return saved_model.export(FLAGS.model_dir, export_dir, saved_model.Options(
      FLAGS.src_lang, FLAGS.tgt_lang, search, FLAGS.checkpoint, FLAGS.precision,
      FLAGS.shortlist_size, FLAGS.shortlist_per_source, data_config, batching=batching))


def _ct2_translate_fns(clients: int, random_model=None):
  """{"ct2_<compute type>_<inter>x<intra>": fn(text) -> text} over --model_dir (or
  `random_model`) exported to CTranslate2, one per compute type and --ct2_intra_threads."""
  import ctranslate2
  import sentencepiece

  from export import ctranslate2 as ct2_export

  folder = os.path.join(FLAGS.workdir, "soak_ct2")
  if not os.path.isdir(folder):
    if random_model:
      ct2_export.save(random_model[0], random_model[1], folder)
    else:
      ct2_export.export(FLAGS.model_dir, FLAGS.src_lang, FLAGS.tgt_lang, folder,
                        checkpoint=FLAGS.checkpoint)
  names = ("spm.joint.model", "spm.model")
  models = sorted(name for name in os.listdir(folder) if name.startswith("spm."))
  source = next(m for m in models if m in names + (f"spm.{FLAGS.src_lang}.model",))
  target = next(m for m in models if m in names + (f"spm.{FLAGS.tgt_lang}.model",))
  source = sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, source))
  target = sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, target))
  cores = os.cpu_count() or 1
  fns = {}
  for compute_type in FLAGS.ct2:
    for intra in sorted({int(value) for value in FLAGS.ct2_intra_threads}):
      inter = max(1, min(clients, cores // intra))
      translator = ctranslate2.Translator(folder, device="cpu", compute_type=compute_type,
                                          inter_threads=inter, intra_threads=intra)

      def translate(text, translator=translator):
        pieces = source.encode(text, out_type=str)[:FLAGS.max_length]
        if not pieces:
          return ""
        longest = FLAGS.max_decode_length or len(pieces) + 1 + FLAGS.extra_decode_length
        result = translator.translate_batch(
            [pieces], beam_size=FLAGS.beam_size, length_penalty=FLAGS.alpha,
            min_decoding_length=FLAGS.min_decode_length, max_decoding_length=longest)
        return target.decode(result[0].hypotheses[0])

      fns[f"ct2_{compute_type}_{inter}x{intra}"] = translate
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


def _saved_model_fns(tf, random_model, sentences, loads: list) -> dict:
  """{name: fn(text) -> outputs}: the export (with --batching, the batching one, and with
  --also_unbatched the plain one too), loaded, warmed up as a server would be and on a spread
  of the lengths of `sentences`. Appends to `loads` what each load cost: the export's warm-up
  requests, and the seconds and memory mappings their replay took."""
  from tf_transformer.serving import warmup

  batching = export_saved_model.batching_config_from_flags()
  exports = [batching] + ([None] if batching and FLAGS.also_unbatched else [])
  name = (f"saved_model_{FLAGS.precision}" + ("" if FLAGS.decode_jit else "_graph")
          + (f"_shortlist{FLAGS.shortlist_size}" if FLAGS.shortlist_size else ""))
  fns = {}
  for setting in exports:
    folder = _export(setting, random_model)
    loaded = tf.saved_model.load(folder)
    serve = loaded.signatures["serving_default"]
    if setting:  # as TF Serving at load: each merged batch size compiles
      start, mappings = time.perf_counter(), warmup.memory_mappings()
      warmups = warmup.replay_warmup_requests(folder, loaded)
      loads.append({"export": folder, "warmup_requests": warmups,
                    "warmup_seconds": round(time.perf_counter() - start, 1),
                    "memory_mappings_added": warmup.memory_mappings() - mappings})
      print(f"{folder}: {warmups} warm-up requests replayed in "
            f"{loads[-1]['warmup_seconds']:.0f} s, "
            f"{loads[-1]['memory_mappings_added']:,} memory mappings added", flush=True)
    # every shape bucket of one sentence compiles before the clock: a spread of lengths
    for text in sorted(set(sentences), key=len)[::max(1, len(set(sentences)) // 100)]:
      serve(inputs=tf.constant([text]))

    # (`loaded` bound too: the signature's variables live as long as the object that loaded them)
    def saved_model(text, serve=serve, loaded=loaded):
      return serve(inputs=tf.constant([text]))["outputs"].numpy()

    fns[name + ("_batching" if setting else "")] = saved_model
  return fns


def main(argv):
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

  FLAGS.set_default("decode_jit", True)  # as export_saved_model exports
  tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
  tf.config.threading.set_inter_op_parallelism_threads(FLAGS.inter_op_threads)
  random_model = None if FLAGS.model_dir else _random_model()
  sentences = _sentences()
  loads = []
  ours = _saved_model_fns(tf, random_model, sentences, loads)
  rss_start = _rss_mib()
  report, summary = [], []
  for clients in (int(c) for c in FLAGS.clients):
    systems = dict(ours)
    if FLAGS.ct2:
      systems.update(_ct2_translate_fns(clients, random_model))
    for translate in systems.values():
      translate(sentences[0])  # a CTranslate2 translator's first call loads it
    rounds = {name: [] for name in systems}
    for round_ in range(FLAGS.rounds):
      for name, translate in systems.items():
        result = dict(_soak(translate, sentences, clients), system=name, round=round_ + 1,
                      rss_mib_start=rss_start)
        report.append(result)
        rounds[name].append(result)
        print(f"{name:36s} {clients:2d} clients, round {round_ + 1}: {result['requests']} "
              f"requests, {result['requests_per_s']:.2f}/s, p50 {result['p50_ms']:.0f} ms, "
              f"p99 {result['p99_ms']:.0f} ms, {result['errors']} errors; RSS "
              f"{rss_start:.0f} / {result['rss_mib_middle']:.0f} / "
              f"{result['rss_mib_end']:.0f} MiB (start / middle / end)", flush=True)
    for name, results in rounds.items():
      summary.append({"system": name, "clients": clients, **{
          key: statistics.median(r[key] for r in results)
          for key in ("requests_per_s", "p50_ms", "p99_ms")},
          "errors": sum(r["errors"] for r in results)})
  print(f"medians over {FLAGS.rounds} round(s):")
  for row in summary:
    print(f"  {row['system']:36s} {row['clients']:2d} clients: "
          f"{row['requests_per_s']:.2f} req/s, p50 {row['p50_ms']:.0f} ms, "
          f"p99 {row['p99_ms']:.0f} ms, {row['errors']} errors")
  print(json.dumps({"minutes": FLAGS.minutes, "rounds": FLAGS.rounds,
                    "model_dir": FLAGS.model_dir, "sentences": FLAGS.sentences,
                    "beam_size": FLAGS.beam_size, "intra_op_threads": FLAGS.intra_op_threads,
                    "inter_op_threads": FLAGS.inter_op_threads, "loads": loads, "medians": summary,
                    "results": report}))


if __name__ == "__main__":
  cli.run(main)  # a refused load (too few memory mappings, say) ends in one line
