"""Decoding throughput of the exported SavedModel and the in-process tf.function (a benchmark).

    python -m bench.decode_speed --flagfile=flags/small.cfg [--repeats 2]

A randomly initialised model of the preset's dims (no training needed) decodes --n_sents
sentences of random subword ids (source length uniform in [--min_src, --max_src] plus EOS) in
batches of --batch_size, every hypothesis forced to exactly --tgt_len tokens (minimum = maximum
length, as ../shared/bench/peers/hf_ct2_decode.py does), for each beam size in --beams:
  - "function": the in-process tf.function over id batches ("function_jit": XLA-compiled);
  - "saved_model": the exported string-to-string SavedModel (tokenization included), loaded back,
    with the XLA-compiled search that tf_transformer.bin.export_saved_model writes by default
    ("saved_model_graph": exported with --nodecode_jit; "saved_model_bfloat16" and
    "saved_model_int8": exported with --precision=bfloat16 or int8; "saved_model_shortlist"
    and "saved_model_int8_shortlist": float32 and int8 with a vocabulary shortlist of
    --shortlist_size target pieces (1024 by default here), its lexicon of
    --shortlist_per_source candidates counted over random id pairs of the bench's lengths, so
    a request's shortlist holds lexical candidates as a real one does; "saved_model_ensemble2":
    an ensemble of this model and a second one of the same dims, one search over both;
    "saved_model_sample": its `sample` signature, a random sample of the whole distribution a
    sentence, timed with the beam-1 rows; "saved_model_constrained": its
    `translate_constrained` signature, each sentence with --constraint_words terms, each a
    random word of the target vocabulary, which its outputs must contain);
  - "ct2": the same model exported to CTranslate2 (export/ct2_spec.py), float32, on
    --ct2_threads threads, on the same subword pieces: CTranslate2 on exactly our weights
    ("ct2_int8": its int8 compute type, the weights quantised when loaded).
--batch_size=1 times one sentence per request, the serving case.
One untimed pass first, then --repeats timed passes. The last line is one JSON object with
sentences/s and target tokens/s per (path, beam).
"""

import contextlib
import json
import os
import statistics
import sys
import time

from absl import app, flags

from bench import op_profile
from tf_transformer import config
from tf_transformer.bin import shared_flags  # (defines the model flags)
from tf_transformer.bin import export_saved_model  # (defines --shortlist_size, 1024 here)

flags.DEFINE_integer("n_sents", 500, "Sentences decoded per pass.")
flags.DEFINE_integer("min_src", 10, "Shortest source (tokens before EOS).")
flags.DEFINE_integer("max_src", 30, "Longest source (tokens before EOS).")
flags.DEFINE_integer("tgt_len", 30, "Exact target length (min = max).")
flags.DEFINE_list("beams", ["4", "1"], "Beam sizes.")
flags.DEFINE_list("paths", ["function", "function_jit", "saved_model"],
                  "What to time: function, function_jit, saved_model, saved_model_graph, "
                  "saved_model_bfloat16, saved_model_int8, saved_model_shortlist, "
                  "saved_model_int8_shortlist, saved_model_ensemble2, saved_model_sample, "
                  "saved_model_constrained, ct2, ct2_int8.")
flags.DEFINE_integer("constraint_words", 2, "Terms a sentence of saved_model_constrained.",
                     lower_bound=1)
flags.DEFINE_integer("repeats", 2, "Timed passes per (path, beam).")
flags.DEFINE_string("workdir", "/tmp/tf_transformer_decode_bench", "Subword model, exports.")
flags.DEFINE_string("profile_dir", "", "Trace the timed passes there; print time by op type.")
flags.DEFINE_integer("ct2_threads", 2, "CTranslate2's intra_threads (its int8 can be faster on "
                     "1, one sentence per request and in batches: docs/speed.md).", lower_bound=1)
FLAGS = flags.FLAGS


def _subword_model(path, vocab_size, rng):
  """A SentencePiece model of about `vocab_size` pieces over random letter words."""
  from data_pipeline import tokenizer
  if not os.path.exists(path):
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(list(letters), rng.integers(3, 9))) for _ in range(40000)]
    sentences = (" ".join(rng.choice(words, 12)) for _ in range(60000))
    tokenizer.train_sentencepiece(sentences, path, vocab_size)
  return tokenizer.load_vocabulary(path, path)


def _random_lexicon(rng, source_size, target_size, pairs=20_000):
  """A shortlist Lexicon (--shortlist_per_source candidates per source id) counted over `pairs`
  random id pairs of the bench's source and target lengths: the model is random, so is its
  lexicon."""
  import numpy as np

  from data_pipeline import lexical_shortlist
  from data_pipeline.token_ids import EOS_ID

  def ragged(size, min_length, max_length):
    lengths = rng.integers(min_length, max_length + 1, 1000)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return splits, rng.integers(EOS_ID + 1, size, splits[-1]).astype(np.int32)

  blocks = ((ragged(source_size, FLAGS.min_src, FLAGS.max_src),
             ragged(target_size, FLAGS.tgt_len, FLAGS.tgt_len)) for _ in range(pairs // 1000))
  return lexical_shortlist.build(blocks, source_size, target_size, FLAGS.shortlist_per_source)


def _random_terms(vocabulary, rng, text_batches):
  """For each batch of texts, string [B] constraints: --constraint_words random words of the
  target vocabulary (its pieces that begin a word) a sentence, tab-separated."""
  import tensorflow as tf

  pieces = [p.decode() for p in vocabulary.target.id_to_string(
      tf.range(vocabulary.target_size)).numpy()]
  words = [p[1:] for p in pieces if p.startswith("\u2581") and len(p) > 1]
  return [tf.constant(["\t".join(rng.choice(words, FLAGS.constraint_words, replace=False))
                       for _ in range(int(tf.size(texts)))]) for texts in text_batches]


def _timed(run_pass):
  run_pass()  # warm-up: every batch shape traced once
  times = []
  profile = op_profile.traced(FLAGS.profile_dir) if FLAGS.profile_dir else contextlib.nullcontext()
  with profile:
    for _ in range(FLAGS.repeats):
      start = time.perf_counter()
      run_pass()
      times.append(time.perf_counter() - start)
  if FLAGS.profile_dir:
    print(op_profile.table(FLAGS.profile_dir), file=sys.stderr)
  return times


def _ct2_translate(translator, pieces, beam, length):
  """A pass of CTranslate2 `translator` over `pieces` (the source sentences as subword
  pieces); every output exactly `length` tokens."""
  batches = [pieces[i:i + FLAGS.batch_size] for i in range(0, len(pieces), FLAGS.batch_size)]

  def run_pass():
    for batch in batches:
      for result in translator.translate_batch(batch, beam_size=beam, min_decoding_length=length,
                                               max_decoding_length=length):
        assert len(result.hypotheses[0]) == length
  return run_pass


def main(argv):
  import numpy as np
  import tensorflow as tf

  from data_pipeline.token_ids import EOS_ID
  from tf_transformer import decoding, runtime
  from tf_transformer.model import build_model
  from tf_transformer.config import DecodeConfig
  from tf_transformer.decoding.ensemble import Ensemble
  from tf_transformer.serving.translator import Translator

  strategy = runtime.set_up_runtime(config.TrainConfig(model_dir="", seed=FLAGS.seed))
  del strategy
  rng = np.random.default_rng(FLAGS.seed)
  os.makedirs(FLAGS.workdir, exist_ok=True)
  vocabulary = _subword_model(os.path.join(FLAGS.workdir, "spm.model"), FLAGS.vocab_size, rng)
  model_config = shared_flags.model_config_from_flags(vocabulary.source_size,
                                                      vocabulary.target_size)
  model = build_model(model_config)

  lengths = rng.integers(FLAGS.min_src, FLAGS.max_src + 1, FLAGS.n_sents)
  rows = [list(rng.integers(EOS_ID + 1, vocabulary.source_size, n)) for n in lengths]
  id_batches, text_batches = [], []
  for start in range(0, FLAGS.n_sents, FLAGS.batch_size):
    batch = [row + [EOS_ID] for row in rows[start:start + FLAGS.batch_size]]
    id_batches.append(tf.ragged.constant(batch, dtype=tf.int32).to_tensor())
    texts = vocabulary.source.detokenize(tf.ragged.constant(rows[start:start + FLAGS.batch_size],
                                                            dtype=tf.int32))
    text_batches.append(texts)

  pieces = [[p.decode() for p in vocabulary.source.id_to_string(row).numpy()] for row in rows]
  ct2_translators = {}
  for path, compute_type in (("ct2", "float32"), ("ct2_int8", "int8")):
    if path in FLAGS.paths:
      import ctranslate2
      from export import ctranslate2 as ct2_export
      folder = os.path.join(FLAGS.workdir, "ct2")
      if not os.path.isdir(folder):
        ct2_export.save(model, vocabulary, folder)
      ct2_translators[path] = ctranslate2.Translator(
          folder, device="cpu", inter_threads=1, intra_threads=FLAGS.ct2_threads,
          compute_type=compute_type)

  def model_in(precision, members=1):
    """`model`, or a copy of it converted to `precision` (the conversion is in place); with
    more members, an ensemble of it and members - 1 other models of its dims."""
    if members > 1:
      return Ensemble((model,) + tuple(build_model(model_config) for _ in range(members - 1)))
    if precision == "float32":
      return model
    copy = build_model(model_config)
    copy.set_weights(model.get_weights())
    return copy
  results = []
  lexicon = None  # made at the first *_shortlist path
  for beam in (int(b) for b in FLAGS.beams):
    length = FLAGS.tgt_len
    for path, jit in (("function", False), ("function_jit", True)):
      if path in FLAGS.paths:
        search = DecodeConfig(beam_size=beam, alpha=0.6, min_decode_length=length,
                              max_decode_length=length)
        decode = tf.function(lambda ids, search=search: decoding.decode(model, ids, search)[0],
                             jit_compile=jit)
        times = _timed(lambda: [decode(ids).numpy() for ids in id_batches])
        results.append((path, beam, times))
    for path, jit, precision, shortlisted, members in (
        ("saved_model", True, "float32", False, 1),
        ("saved_model_graph", False, "float32", False, 1),
        ("saved_model_bfloat16", True, "bfloat16", False, 1),
        ("saved_model_int8", True, "int8", False, 1),
        ("saved_model_shortlist", True, "float32", True, 1),
        ("saved_model_int8_shortlist", True, "int8", True, 1),
        ("saved_model_ensemble2", True, "float32", False, 2),
        ("saved_model_sample", True, "float32", False, 1),
        ("saved_model_constrained", True, "float32", False, 1)):
      sampling = path == "saved_model_sample"
      if path in FLAGS.paths and (beam == 1 or not sampling):
        shortlist = {}
        if shortlisted:
          if lexicon is None:
            lexicon = _random_lexicon(rng, vocabulary.source_size, vocabulary.target_size)
          shortlist = dict(shortlist_size=FLAGS.shortlist_size, lexicon=lexicon)
        search = DecodeConfig(beam_size=beam, max_source_length=FLAGS.max_length,
                              min_decode_length=length, max_decode_length=length,
                              decode_jit=jit)
        module = Translator(model_in(precision, members), vocabulary, search,
                            precision=precision, **shortlist)
        export_dir = os.path.join(FLAGS.workdir, f"{path}_beam{beam}")
        tf.saved_model.save(module, export_dir, signatures=module.signatures())
        signatures = tf.saved_model.load(export_dir).signatures
        if sampling:  # one seed a row
          sample = signatures["sample"]
          times = _timed(lambda: [sample(inputs=texts, seed=tf.range(tf.size(texts),
                                                                     dtype=tf.int64))
                                  ["outputs"].numpy() for texts in text_batches])
        elif path == "saved_model_constrained":
          constrained = signatures["translate_constrained"]
          terms = _random_terms(vocabulary, rng, text_batches)
          times = _timed(lambda: [constrained(inputs=texts, constraints=batch_terms)
                                  ["outputs"].numpy()
                                  for texts, batch_terms in zip(text_batches, terms)])
        else:
          serve = signatures["serving_default"]
          times = _timed(lambda: [serve(inputs=texts)["outputs"].numpy()
                                  for texts in text_batches])
        results.append((path, beam, times))
    for path, translator in ct2_translators.items():
      times = _timed(_ct2_translate(translator, pieces, beam, length))
      results.append((path, beam, times))

  report = []
  for path, beam, times in results:
    median = statistics.median(times)
    report.append({"path": path, "beam": beam, "pass_s": times,
                   "sent_per_s": FLAGS.n_sents / median,
                   "tgt_tok_per_s": FLAGS.n_sents * FLAGS.tgt_len / median})
    print(f"{path:20s} beam {beam}: {FLAGS.n_sents / median:7.1f} sentences/s, "
          f"{FLAGS.n_sents * FLAGS.tgt_len / median:8.1f} target tokens/s", flush=True)
  print(json.dumps({"n_sents": FLAGS.n_sents, "batch_size": FLAGS.batch_size,
                    "tgt_len": FLAGS.tgt_len, "results": report}))


if __name__ == "__main__":
  FLAGS.set_default("shortlist_size", 1024)  # export_saved_model's 0 would time no shortlist
  app.run(main)
