"""Decoding speed of an imported OPUS-MT-sized model: our SavedModels against Hugging Face
transformers' `generate` and CTranslate2's own conversion of the same Marian folder (a benchmark).

    python -m bench.marian_speed [--rounds=2] [--data=../shared/data/multi30k]

1. bench/peers/marian_base.py builds, in the peers' environment (--peer_python), a Marian folder
   of Helsinki-NLP/opus-mt-en-de's dimensions (6 + 6 layers, d_model 512, 58,101 ids) with random
   weights and SentencePiece models trained on the English and German lines of --data, and
   converts it with CTranslate2's converter.
2. tf_transformer.bin.import_marian imports the folder; export/saved_model.py exports it twice,
   XLA-compiled as export_saved_model does by default: float32, and int8 with a shortlist of
   --shortlist_size target pieces (its lexicon counted over --data's training pairs).
3. Each system then translates the first sentences of --data's test_2016_flickr English, string
   to string, every output exactly --length pieces (minimum = maximum length: the same decoder
   steps for every system, whatever random weights would end), beam --beam: --sentences_1 at
   batch size 1 (the serving case) and --sentences_32 at 32. Each (system, batch size) runs in a
   fresh process: one untimed pass, then one timed pass. The systems take turns, round after
   round, and the medians of the rounds are compared: these machines are shared and noisy.

The last line is one JSON object: target tokens/s per system and batch size, and each system's
ratio to transformers' and to CTranslate2's float32.
"""

import gzip
import json
import os
import statistics
import subprocess
import sys

from absl import app, flags

from bench.peers.marian_base import peak_rss_mib

flags.DEFINE_string("workdir", "/tmp/tf_transformer_marian_bench",
                    "The Marian folder, its conversions, imports and exports.")
flags.DEFINE_string("data", os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                         os.pardir, "shared", "data", "multi30k"),
                    "A folder with train.{en,de}.gz and test_2016_flickr.en.gz.")
flags.DEFINE_string("peer_python", "/tmp/peerenv/bin/python",
                    "The peers' Python (../shared/bench/peers/setup.sh).")
flags.DEFINE_integer("rounds", 2, "Turns of every system.")
flags.DEFINE_integer("beam", 4, "Beam size.")
flags.DEFINE_integer("length", 30, "Exact target length in pieces.")
flags.DEFINE_integer("sentences_1", 32, "Sentences translated one at a time.")
flags.DEFINE_integer("sentences_32", 128, "Sentences translated 32 at a time.")
flags.DEFINE_integer("shortlist_size", 1024, "The int8 export's shortlist.")
flags.DEFINE_list("systems", ["saved_model", "saved_model_int8_shortlist", "hf", "ct2",
                              "ct2_int8"], "What to time.")
flags.DEFINE_string("worker", None, "(internal) time one SavedModel: its folder.")
flags.DEFINE_string("texts", None, "(internal) the worker's source lines.")
flags.DEFINE_integer("batch_size", 32, "(internal) the worker's batch size.")

FLAGS = flags.FLAGS

_PEER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "marian_base.py")
_EXPORTS = {"saved_model": ("float32", False), "saved_model_int8_shortlist": ("int8", True)}


def _lines(path, limit=None):
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [line.rstrip("\n") for _, line in zip(range(limit or 10**9), f)]


def _write(path, lines):
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(line + "\n" for line in lines)


def _run(command):
  result = subprocess.run(command, capture_output=True, text=True)
  if result.returncode:
    raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def _prepare(workdir):
  """The Marian folder, its import and our exports (each made once); returns the export
  folders by system."""
  from export import saved_model
  from tf_transformer.config import DataConfig, DecodeConfig

  data_dir = os.path.join(workdir, "data")
  if not os.path.isdir(data_dir):
    os.makedirs(data_dir + ".tmp", exist_ok=True)
    for lang in ("en", "de"):
      _write(os.path.join(data_dir + ".tmp", f"train.{lang}"),
             _lines(os.path.join(FLAGS.data, f"train.{lang}.gz")))
    os.rename(data_dir + ".tmp", data_dir)
  marian_dir = os.path.join(workdir, "marian")
  if not os.path.isdir(os.path.join(marian_dir, "ct2")):
    print(_run([FLAGS.peer_python, _PEER_SCRIPT, "build", f"--out={marian_dir}",
                f"--source={data_dir}/train.en", f"--target={data_dir}/train.de"]), flush=True)
  model_dir = os.path.join(workdir, "imported")
  if not os.path.isfile(os.path.join(model_dir, "final.json")):
    subprocess.run([sys.executable, "-m", "tf_transformer.bin.import_marian",
                    f"--from={marian_dir}/hf", f"--model_dir={model_dir}"], check=True)
  search = DecodeConfig(beam_size=FLAGS.beam, min_decode_length=FLAGS.length,
                        max_decode_length=FLAGS.length, decode_jit=True)
  exports = {}
  for system, (precision, shortlist) in _EXPORTS.items():
    if system not in FLAGS.systems:
      continue
    folder = os.path.join(workdir, f"{system}_beam{FLAGS.beam}_length{FLAGS.length}")
    if not os.path.isdir(folder):
      options = saved_model.Options(
          "en", "de", search, precision=precision,
          shortlist_size=FLAGS.shortlist_size if shortlist else 0,
          data_config=DataConfig(data_dir=data_dir, src_lang="en", tgt_lang="de"))
      saved_model.export(model_dir, folder + ".tmp", options)
      os.rename(folder + ".tmp", folder)
    versions = [name for name in os.listdir(folder) if name.isdigit()]
    exports[system] = os.path.join(folder, max(versions, key=int))
  return marian_dir, exports


def _time_saved_model():
  """The worker: one untimed and one timed pass of serving_default over --texts."""
  import time

  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the export holds)

  with open(FLAGS.texts, encoding="utf-8") as f:
    texts = [line.rstrip("\n") for line in f]
  serve = tf.saved_model.load(FLAGS.worker).signatures["serving_default"]
  batches = [tf.constant(texts[i:i + FLAGS.batch_size])
             for i in range(0, len(texts), FLAGS.batch_size)]

  def run_pass():
    return [serve(inputs=batch)["outputs"].numpy() for batch in batches]
  run_pass()
  start = time.perf_counter()
  run_pass()
  seconds = time.perf_counter() - start
  print(json.dumps({"pass_s": [seconds], "tgt_tok_per_s": len(texts) * FLAGS.length / seconds,
                    "peak_rss_mib": peak_rss_mib()}))


def _cpu():
  fields = {}
  for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
    key, _, value = line.partition(":")
    fields[key.strip()] = value.strip()
  return {key: fields.get(key) for key in ("Model name", "CPU family", "Model")}


def main(argv):
  del argv
  if FLAGS.worker:
    _time_saved_model()
    return
  workdir = FLAGS.workdir
  os.makedirs(workdir, exist_ok=True)
  marian_dir, exports = _prepare(workdir)
  texts = {}
  for batch_size, count in ((1, FLAGS.sentences_1), (32, FLAGS.sentences_32)):
    texts[batch_size] = os.path.join(workdir, f"test.{count}.en")
    _write(texts[batch_size], _lines(os.path.join(FLAGS.data, "test_2016_flickr.en.gz"), count))

  def command(system, batch_size):
    if system in exports:
      return [sys.executable, "-m", "bench.marian_speed", f"--worker={exports[system]}",
              f"--texts={texts[batch_size]}", f"--batch_size={batch_size}",
              f"--length={FLAGS.length}"]
    return [FLAGS.peer_python, _PEER_SCRIPT, "time", f"--system={system}",
            f"--model={marian_dir}", f"--texts={texts[batch_size]}",
            f"--batch_size={batch_size}", f"--beam={FLAGS.beam}", f"--length={FLAGS.length}"]

  speeds = {(system, batch_size): [] for system in FLAGS.systems for batch_size in (1, 32)}
  for round_ in range(FLAGS.rounds):
    for batch_size in (1, 32):
      for system in FLAGS.systems:
        report = _run(command(system, batch_size))
        speeds[system, batch_size].append(report["tgt_tok_per_s"])
        print(f"round {round_ + 1}, batch {batch_size:2d}: {system:28s} "
              f"{report['tgt_tok_per_s']:7.1f} target tokens/s, peak RSS "
              f"{report['peak_rss_mib']:.0f} MiB", flush=True)
  medians = {key: statistics.median(values) for key, values in speeds.items()}
  rows = []
  print(f"\n{'system':28s} {'batch':>5s} {'tokens/s':>9s} {'/ HF':>6s} {'/ CT2':>6s}")
  for (system, batch_size), median in medians.items():
    row = {"system": system, "batch_size": batch_size, "tgt_tok_per_s": median,
           "per_round": speeds[system, batch_size]}
    for peer in ("hf", "ct2"):
      if (peer, batch_size) in medians:
        row[f"over_{peer}"] = median / medians[peer, batch_size]
    rows.append(row)
    print(f"{system:28s} {batch_size:5d} {median:9.1f} {row.get('over_hf', float('nan')):6.2f} "
          f"{row.get('over_ct2', float('nan')):6.2f}")
  print(json.dumps({"cpu": _cpu(), "beam": FLAGS.beam, "length": FLAGS.length,
                    "shortlist_size": FLAGS.shortlist_size, "rounds": FLAGS.rounds,
                    "rows": rows}))


if __name__ == "__main__":
  app.run(main)
