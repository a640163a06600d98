"""In-graph batching (export_saved_model --batching): concurrent requests to a signature run as
one search, each caller gets its own rows back, and every batch size is compiled at load."""

import json
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer.serving import signatures

# A batch that waits this long for requests, unless it is full: in these tests a request runs
# only once others have filled its batch.
_MERGE_TIMEOUT_SECONDS = 600
_MERGE_ROWS = 8
# How long a lone request is given to return, which a batching signature never does (it waits
# _MERGE_TIMEOUT_SECONDS for others) and an unbatched one does on an idle machine.
_LONE_REQUEST_SECONDS = 1.0


def _export(model_dir, export_dir, *args) -> pathlib.Path:
  result = testutil.run_cli("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
                            f"--model_dir={model_dir}", f"--export_dir={export_dir}",
                            "--beam_size=2", "--extra_decode_length=5", *args)
  assert result.returncode == 0, result.stderr
  return pathlib.Path(result.stdout.strip().splitlines()[-1])


# Of the tiny model's 60 pieces: a merged batch of _MERGE_ROWS sentences that searched one
# shortlist of _SHORTLIST pieces a sentence would search the whole vocabulary.
_SHORTLIST = 8


@pytest.fixture(scope="module")
def exports(tiny_model_dir, tmp_path_factory):
  """{name: version folder}: the tiny model exported with XLA (the export's default) "plain"
  (no batching), "batched" (--batching, batches of at most 2 rows, inputs cut at 20 pieces: its
  width ladder 16 and 32 pieces) and "merging" (--batching with
  batches of at most _MERGE_ROWS rows that wait _MERGE_TIMEOUT_SECONDS for requests: a request
  runs only when others fill its batch). Each
  searches shortlists of _SHORTLIST pieces a sentence, its lexicon counted over pairs of the
  tiny model's words."""
  folder = tmp_path_factory.mktemp("batching")
  words = ["".join(chr(97 + i) * 2) for i in range(26)]
  rng = np.random.default_rng(0)
  sources = [" ".join(rng.choice(words, size=5)) for _ in range(200)]
  (folder / "train.src").write_text("".join(line + "\n" for line in sources))
  (folder / "train.tgt").write_text("".join(" ".join(line.split()[::-1]) + "\n"
                                            for line in sources))
  shortlist = (f"--shortlist_size={_SHORTLIST}", f"--data_dir={folder}", "--src_lang=src",
               "--tgt_lang=tgt", "--train_prefix=train")
  return {
      "plain": _export(tiny_model_dir, folder / "plain", *shortlist),
      "batched": _export(tiny_model_dir, folder / "batched", "--batching",
                         "--batching_max_size=2", "--max_length=20", *shortlist),
      "merging": _export(tiny_model_dir, folder / "merging", "--batching",
                         f"--batching_max_size={_MERGE_ROWS}",
                         f"--batching_timeout_micros={_MERGE_TIMEOUT_SECONDS * 10**6}",
                         *shortlist)}


@pytest.fixture(scope="module")
def loaded(exports):
  return {name: tf.saved_model.load(str(path)) for name, path in exports.items()}


# Requests of 5, 1 and 2 rows that fill one batch of _MERGE_ROWS rows together; texts of
# different lengths, so that a merged batch is padded to its longest. The first, alone, pads to
# the XLA shapes of the whole batch (rows to 8; its texts, prefixes and phrases to the widths of
# all eight): a signature that does not batch runs it at once, with no compilation to wait for.
_TEXTS = ["aa bb", "cc dd ee ff gg hh ii", "", "jj", "kk ll mm nn", "oo pp qq", "rr", "ss tt uu"]
_ROWS = (5, 1, 2)
# A phrase to avoid of 9 pieces: wider than the compiled search's narrow width (8), so a merged
# batch that holds it runs at the wide one (serving/xla_shapes.py NARROW_CONSTRAINTS)
_WIDE = "!" + " ".join(["aa"] * 9)
_CONSTRAINTS = ["ss", "", _WIDE, "tt\t!bb", "uu vv", "", "ww", _WIDE]


def _requests(signature: str) -> list[dict]:
  """The inputs of len(_ROWS) requests to `signature`, _ROWS[i] rows each, _MERGE_ROWS in all."""
  requests, start = [], 0
  for rows in _ROWS:
    texts = tf.constant(_TEXTS[start:start + rows])
    inputs = {"source": texts, "target": tf.constant(_TEXTS[::-1][start:start + rows])} if (
        signature == "score") else {"inputs": texts}
    if signature in ("translate_prefix", "sample_prefix", "translate_constrained_prefix"):
      inputs["prefix"] = tf.constant(["aa", ""] * 4)[:rows]
    if signature.startswith("translate_constrained"):
      inputs["constraints"] = tf.constant(_CONSTRAINTS[start:start + rows])
    if signature in ("sample", "sample_prefix"):
      inputs["seed"] = tf.range(start, start + rows, dtype=tf.int64) * 7919
    requests.append(inputs)
    start += rows
  return requests


def _assert_same_outputs(got: dict, want: dict, where: str):
  assert sorted(got) == sorted(want), where
  for key, value in want.items():
    if value.dtype == tf.string:
      assert got[key].numpy().tolist() == value.numpy().tolist(), f"{where}: {key}"
    else:
      np.testing.assert_allclose(got[key].numpy(), value.numpy(), rtol=1e-5, atol=1e-5,
                                 err_msg=f"{where}: {key}")


@pytest.mark.parametrize("signature", ["serving_default", "translate_nbest", "translate_prefix",
                                       "sample", "sample_prefix", "score",
                                       "translate_constrained",
                                       "translate_constrained_prefix"])
def test_concurrent_requests_merge_and_each_caller_gets_its_own_rows(loaded, signature):
  """The first request waits, alone, for others (a signature that does not batch returns);
  the rest fill its batch, which then runs, and each caller gets the rows the unbatched export
  gives its own request."""
  requests = _requests(signature)
  want = [loaded["plain"].signatures[signature](**inputs) for inputs in requests]
  function = loaded["merging"].signatures[signature]
  # one request of all their rows is a full batch, which runs at once: it compiles the merged
  # batch's shapes first
  function(**{key: tf.concat([inputs[key] for inputs in requests], 0) for key in requests[0]})
  got, errors = [None] * len(requests), []

  def call(index):
    try:
      got[index] = function(**requests[index])
    except Exception as e:  # pylint: disable=broad-except  (reported by the main thread)
      errors.append(e)

  threads = [threading.Thread(target=call, args=(index,)) for index in range(len(requests))]
  threads[0].start()
  threads[0].join(_LONE_REQUEST_SECONDS)
  assert threads[0].is_alive() and not errors, (
      f"{signature}: a lone request returned at once, unmerged", errors)
  for thread in threads[1:]:
    thread.start()
  for thread in threads:
    thread.join(_MERGE_TIMEOUT_SECONDS / 2)  # a bound against a hang, not a time measured
  assert not any(thread.is_alive() for thread in threads), f"{signature}: the batch never ran"
  assert not errors, errors
  for index, (inputs, result) in enumerate(zip(requests, got)):
    _assert_same_outputs(result, want[index], f"{signature} request {index}")


def test_large_empty_and_malformed_requests_as_without_batching(loaded):
  plain, batched = loaded["plain"].signatures, loaded["batched"].signatures
  many = tf.constant([_TEXTS[i % len(_TEXTS)][:8] for i in range(70)])  # above 2 rows
  _assert_same_outputs(batched["translate_nbest"](inputs=many),
                       plain["translate_nbest"](inputs=many), "70 rows")
  empty = batched["serving_default"](inputs=tf.constant([], tf.string))
  assert empty["outputs"].shape == [0] and empty["scores"].shape == [0]
  empty = batched["translate_nbest"](inputs=tf.constant([], tf.string))
  assert empty["outputs"].shape == [0, 2] and empty["scores"].shape == [0, 2]
  with pytest.raises(tf.errors.InvalidArgumentError, match="same number of rows"):
    batched["translate_prefix"](inputs=tf.constant(["aa", "bb"]), prefix=tf.constant(["aa"]))
  # the static shapes of the outputs are the unbatched export's (the beam is read off them)
  for name in ("serving_default", "translate_nbest", "score"):
    assert (loaded["batched"].signatures[name].structured_outputs
            == loaded["plain"].signatures[name].structured_outputs), name


_COUNT_COMPILATIONS = """
import json, os, sys, threading
import tensorflow as tf
import tf_transformer

dump = sys.argv[2]
model = tf_transformer.load(sys.argv[1])  # replays the warm-up requests, as TF Serving does
def compilations():
  return sum(name.endswith(".before_optimizations.txt") for name in os.listdir(dump))
texts = json.loads(sys.argv[3])
def call(rows):
  chunk = [texts[(rows + i) % len(texts)] for i in range(rows)]
  model.translate(chunk, nbest=2)
  model.translate(chunk, target_prefix=[texts[-1]] * rows)  # prefixes of every width
  model.translate(chunk, strategy="sample", seed=rows)
  model.score(chunk, chunk)
  model.translate(chunk, constraints=[["ss"]] * rows)  # the narrow constrained width
  model.translate(chunk, constraints=[["!" + " ".join(["aa"] * 9)]] * rows)  # the wide one
def concurrently(rows):
  threads = [threading.Thread(target=call, args=(size,)) for size in rows]
  [thread.start() for thread in threads]
  [thread.join() for thread in threads]
  return compilations()
counts = {"at_load": compilations(), "after": concurrently([1, 2, 3, 4, 8, 5, 1, 2])}
print(json.dumps(counts))
"""


def test_every_batch_size_is_compiled_at_load_and_requests_compile_nothing(exports, tmp_path):
  """Concurrent requests of 1-8 rows of every width up to the limit compile no XLA program
  after the export's load: their merged batches run at the ladder's widths, compiled at load,
  or (prefixes or constraints too wide, more rows than a batch) uncompiled."""
  dump = tmp_path / "xla"
  env = testutil.xla_dump_env(dump)
  # one piece a word, 1 to 40 words (the limit is 20 pieces): source widths 16 and 32
  words = ["aa", "bb", "cc", "dd", "ee"]
  texts = [" ".join(words[i % 5] for i in range(count)) for count in (1, 3, 12, 20, 28, 40)]
  result = subprocess.run(
      [sys.executable, "-c", _COUNT_COMPILATIONS, str(exports["batched"]), str(dump),
       json.dumps(texts)], cwd=testutil.ROOT, env=env, capture_output=True, text=True,
      timeout=600)
  assert result.returncode == 0, result.stderr
  counts = json.loads(result.stdout.strip().splitlines()[-1])
  # a program per search and shape, each shared by the signatures with and without a prefix:
  # the beam search, sampling and the narrow constrained search at each warm-up request's
  # shape (the allowed batch sizes 1 and 2 x the ladder's widths 16 and 32)
  warmups = [rows for name, rows, *_ in _warmup_requests(exports["batched"])
             if name == "serving_default"]
  assert sorted(warmups) == [1, 1, 2, 2]
  assert counts["at_load"] == 3 * len(warmups), counts
  assert counts["after"] == counts["at_load"], counts


def test_a_batch_at_a_shape_no_warm_up_compiled_translates_as_without_batching(loaded):
  """A search at a width padded up to the ladder's, or run uncompiled (its prefix or
  constraints too wide; 8 rows), gives the outputs of the unbatched export's search."""
  plain, batched = loaded["plain"].signatures, loaded["batched"].signatures
  texts = tf.constant([" ".join(["aa", "bb", "cc"] * 6)] * 2 + ["dd ee"] * 6)
  requests = {"translate_nbest": {"inputs": texts[:1]},
              "sample": {"inputs": texts, "seed": tf.range(8, dtype=tf.int64)},
              "translate_prefix": {"inputs": texts[2:3], "prefix": texts[:1]},
              "translate_constrained": {"inputs": texts[2:4], "constraints": tf.constant(
                  ["!" + " ".join(["aa"] * 9), "ss"])}}
  for name, inputs in requests.items():
    _assert_same_outputs(batched[name](**inputs), plain[name](**inputs), name)


def test_a_batching_export_answers_alike_in_a_process_with_only_tensorflow(exports, loaded):
  """The --batching export, loaded by a new interpreter that imports nothing of the project,
  answers every signature, serving_default and translate_constrained as in this process."""
  prefixes = ["ss" if row % 2 else "" for row in range(len(_TEXTS))]
  fresh = testutil.run_export_fresh(exports["batched"], _TEXTS, prefixes, term="ss")
  signatures = loaded["batched"].signatures
  best = signatures["serving_default"](inputs=tf.constant(_TEXTS))
  assert fresh["outputs"] == [o.decode() for o in best["outputs"].numpy()]
  terms = tf.constant(["ss"] + [""] * (len(_TEXTS) - 1))
  constrained = signatures["translate_constrained"](inputs=tf.constant(_TEXTS), constraints=terms)
  assert fresh["constrained"] == [[o.decode() for o in row]
                                  for row in constrained["outputs"].numpy()]


def test_batching_settings_are_recorded(exports):
  settings = json.loads((exports["merging"] / "assets.extra" / "decoding.json").read_text())
  assert settings["batching"] == {
      "max_batch_size": _MERGE_ROWS, "allowed_batch_sizes": [1, 2, 4, 8],
      "batch_timeout_micros": _MERGE_TIMEOUT_SECONDS * 10**6, "num_batch_threads": 1,
      "max_enqueued_batches": 64}
  plain = json.loads((exports["plain"] / "assets.extra" / "decoding.json").read_text())
  assert plain["batching"] is None


def _warmup_requests(version: pathlib.Path) -> list[tuple[str, int, str, str | None,
                                                             str | None]]:
  """(signature, rows, first text, first constraints or None, first prefix or None) of each of
  an export's TF Serving warm-up requests."""
  from tensorflow_serving.apis import prediction_log_pb2

  def first(request, name):
    return (tf.make_ndarray(request.inputs[name])[0].decode() if name in request.inputs
            else None)

  requests = []
  for record in tf.data.TFRecordDataset(
      str(version / "assets.extra" / "tf_serving_warmup_requests")):
    request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
    texts = tf.make_ndarray(request.inputs["source" if "source" in request.inputs else "inputs"])
    requests.append((request.model_spec.signature_name, len(texts), texts[0].decode(),
                     first(request, "constraints"), first(request, "prefix")))
  return requests


def test_warmup_requests_run_each_program_once(exports):
  requests = {}
  for name, rows, text, constraints, prefix in _warmup_requests(exports["batched"]):
    requests.setdefault(name, []).append((rows, text, constraints, prefix))
  for name in signatures.BATCHED:
    if name not in signatures.COMPILING:  # their programs are the others': one request each
      assert [(rows, text) for rows, text, *_ in requests[name]] == [(1, "Hello.")], name
    else:  # each batch size at each width of the ladder, "Hello." the narrowest
      assert sorted(rows for rows, *_ in requests[name]) == [1, 1, 2, 2], name
      assert "Hello." in {text for _, text, *_ in requests[name]}, name
  # the narrow constrained search alone: the wide one runs uncompiled
  for name in ("translate_constrained", "translate_constrained_prefix"):
    assert {constraints for _, _, constraints, _ in requests[name]} == {""}, name
  # the long texts are wider than "Hello.": each width at each batch size
  merging = {}
  for name, rows, text, _, _ in _warmup_requests(exports["merging"]):
    merging.setdefault(name, []).append((rows, text))
  texts = {text for _, text in merging["serving_default"]}
  assert "" not in texts and "Hello." in texts and len(texts) >= 2, texts
  assert sorted(merging["sample"]) == sorted(merging["serving_default"]) == sorted(
      (rows, text) for rows in (1, 2, 4, 8) for text in texts)


def test_warmups_that_would_exhaust_the_memory_mappings_fail_in_one_line_before_they_do(
    exports, monkeypatch):
  """Past vm.max_map_count, XLA's compiler fails and the process dies (a segmentation fault):
  the replay refuses first, naming the setting. A limit just above this process's mappings
  leaves room for the first program, whose growth then refuses the rest."""
  from tf_transformer.serving import warmup
  from tf_transformer.model_dir import ModelDirError

  path = str(exports["batched"])
  loaded = tf.saved_model.load(path)  # a new load: its programs are compiled anew
  limit = warmup.memory_mappings() + 1200
  monkeypatch.setattr(warmup, "memory_mapping_limit", lambda: limit)
  with pytest.raises(ModelDirError, match=r"warm-up requests compile XLA programs that need "
                     r"about [\d,]+ more memory mappings, and vm.max_map_count=[\d,]+ leaves .*"
                     r"raise it \(sysctl -w vm.max_map_count=1048576\)"):
    warmup.replay_warmup_requests(path, loaded)
  assert warmup.memory_mappings() < limit
