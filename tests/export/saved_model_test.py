"""The exported SavedModel: layout, signatures, warm-up records, self-contained loading, bad
inputs, CLI errors."""

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from data_pipeline.token_ids import EOS_ID
from tests import testutil
from tf_transformer import decoding, inference
from tf_transformer.translator import Translator

INPUTS = ["aa bb cc", "", "dd ee", "こんにちは世界", "Tiếng Việt có dấu", "emoji 🙂 \x07 ctl",
          "x" * 5000]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
  return tiny_model_dir


def export(model_dir, export_dir, *args):
  return testutil.run_cli("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
                          f"--model_dir={model_dir}", f"--export_dir={export_dir}",
                          "--beam_size=2", "--extra_decode_length=5", *args)


@pytest.fixture(scope="module")
def exported(model_dir, tmp_path_factory):
  """The export's folder (a pathlib.Path), exported through a file:// URI: every file operation
  goes through tf.io.gfile (os.replace or open would fail on it, as on gs://)."""
  export_dir = tmp_path_factory.mktemp("exports") / "tiny"
  result = export(model_dir, f"file://{export_dir}")
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().splitlines()[-1] == f"file://{export_dir}/1"
  return export_dir


@pytest.fixture(scope="module")
def loaded(exported):
  return tf.saved_model.load(f"file://{exported}/1")  # loads back from the URI too


def test_tf_serving_layout_and_versions(model_dir, exported):
  # the checkpoint step (ckpt-1), and the batching parameters beside the versions
  assert sorted(os.listdir(exported)) == ["1", "batching_parameters.txt"]
  version = exported / "1"
  assert (version / "saved_model.pb").exists() and (version / "variables").is_dir()
  settings = json.loads((version / "assets.extra" / "decoding.json").read_text())
  assert settings["beam_size"] == 2 and settings["alpha"] == 0.6 and settings["nbest"] == 2
  assert settings["precision"] == "float32"
  model, _, _ = inference.load_for_inference(str(model_dir), "en", "de")
  weights = sum(v.numpy().nbytes for v in model.variables if v.dtype == "float32")
  assert _variable_bytes(version)["float32"] == weights  # each saved once
  result = export(model_dir, exported)  # a plain path into the same folder
  assert result.returncode == 0, result.stderr
  # the step is taken: next free number; the batching parameters, unchanged, stay
  assert sorted(os.listdir(exported)) == ["1", "2", "batching_parameters.txt"]
  assert "batching_parameters.txt" not in result.stderr


def test_warmup_requests_cover_every_signature_and_replay(exported, loaded):
  from tensorflow_serving.apis import prediction_log_pb2
  path = exported / "1" / "assets.extra" / "tf_serving_warmup_requests"
  requests = [prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
              for record in tf.data.TFRecordDataset(str(path))]
  batches = {}
  for request in requests:
    name = request.model_spec.signature_name
    signature = loaded.signatures[name]
    # the request's inputs are the signature's, as TF Serving checks before running it
    assert sorted(request.inputs) == sorted(signature.structured_input_signature[1]), name
    inputs = {key: tf.constant(tf.make_ndarray(proto)) for key, proto in request.inputs.items()}
    batch = {int(tensor.shape[0]) for tensor in inputs.values()}.pop()
    batches.setdefault(name, []).append(batch)
    outputs = signature(**inputs)  # replayed as TF Serving replays it at load
    assert sorted(outputs) == sorted(signature.structured_outputs), name
    assert all(tensor.shape[0] == batch for tensor in outputs.values()), name
  assert batches == {name: [1, 8] for name in
                     ("serving_default", "translate_nbest", "translate_prefix", "score", "align")}


def test_saved_model_cli_shows_the_signatures(exported):
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
  result = subprocess.run([cli, "show", "--all", "--dir", str(exported / "1")],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  shown = result.stdout
  for name in ("serving_default", "translate_nbest", "translate_prefix", "score", "align"):
    assert f"signature_def['{name}']" in shown
  serving = shown.split("signature_def['serving_default']")[1].split("signature_def[")[0]
  assert "inputs['inputs'] tensor_info:\n        dtype: DT_STRING" in serving
  assert "outputs['outputs'] tensor_info:\n        dtype: DT_STRING" in serving
  assert "outputs['scores'] tensor_info:\n        dtype: DT_FLOAT" in serving
  prefix = shown.split("signature_def['translate_prefix']")[1].split("signature_def[")[0]
  assert "inputs['prefix'] tensor_info:\n        dtype: DT_STRING" in prefix
  score = shown.split("signature_def['score']")[1].split("signature_def[")[0]
  assert "outputs['log_prob'] tensor_info:\n        dtype: DT_FLOAT" in score
  align = shown.split("signature_def['align']")[1].split("signature_def[")[0]
  assert "outputs['attention'] tensor_info:\n        dtype: DT_FLOAT\n        shape: (-1, -1, -1)" \
      in align


_FRESH_PROCESS = """
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the SentencePiece ops
model = tf.saved_model.load(sys.argv[1])
inputs = tf.constant(json.loads(sys.argv[2]))
best = model.signatures["serving_default"](inputs=inputs)
nbest = model.signatures["translate_nbest"](inputs=inputs)
prefixed = model.signatures["translate_prefix"](inputs=inputs, prefix=tf.constant(
    json.loads(sys.argv[3])))
score = model.signatures["score"](source=inputs[:1], target=tf.constant(["aa"]))
many = model.signatures["serving_default"](inputs=tf.constant(["aa bb"] * 1000))
align = model.signatures["align"](inputs=inputs)
assert not any(name.split(".")[0] in ("tf_transformer", "data_pipeline", "export")
               for name in sys.modules)
print(json.dumps({"outputs": [o.decode() for o in best["outputs"].numpy()],
                  "scores": best["scores"].numpy().tolist(),
                  "nbest_shape": list(nbest["outputs"].shape),
                  "prefixed": [[o.decode() for o in row] for row in prefixed["outputs"].numpy()],
                  "prefixed_scores": prefixed["scores"].numpy().tolist(),
                  "log_prob": score["log_prob"].numpy().tolist(),
                  "many": int(many["outputs"].shape[0]),
                  "align_outputs": [o.decode() for o in align["outputs"].numpy()],
                  "source_tokens": [[t.decode() for t in row]
                                    for row in align["source_tokens"].numpy()],
                  "target_tokens": [[t.decode() for t in row]
                                    for row in align["target_tokens"].numpy()],
                  "attention": align["attention"].numpy().tolist()}))
"""


def _prefixes() -> list[str]:
  """A target prefix per INPUTS row: every other one empty."""
  return ["ss tt" if row % 2 == 0 else "" for row in range(len(INPUTS))]


def test_fresh_process_with_only_tensorflow_translates_like_the_library(model_dir, exported):
  result = testutil.run_python(_FRESH_PROCESS, str(exported / "1"), json.dumps(INPUTS),
                               json.dumps(_prefixes()), cwd="/")
  assert result.returncode == 0, result.stderr
  loaded = json.loads(result.stdout.strip().splitlines()[-1])
  model, vocabulary, _ = inference.load_for_inference(str(model_dir), "en", "de")
  module = Translator(model, vocabulary, beam_size=2, nbest=2, max_length=32,
                      extra_decode_length=5)
  expected = module.serve(tf.constant(INPUTS))
  assert loaded["outputs"] == [o.decode() for o in expected["outputs"].numpy()]
  np.testing.assert_allclose(loaded["scores"], expected["scores"].numpy(), rtol=1e-5)
  assert loaded["outputs"][1] == "" and loaded["scores"][1] == 0.0  # empty in, empty out
  assert loaded["nbest_shape"] == [len(INPUTS), 2]
  assert loaded["many"] == 1000
  # score: the forced-decoding log-probability of "aa" after INPUTS[0], over the length penalty
  ids = [side.tokenize(tf.constant([text])).to_tensor() for side, text in
         ((vocabulary.source, INPUTS[0]), (vocabulary.target, "aa"))]
  source_ids, target_ids = (tf.concat([row, [[EOS_ID]]], axis=1) for row in ids)
  expected_log_prob = decoding.score(model, source_ids, target_ids, alpha=0.6).numpy()
  np.testing.assert_allclose(loaded["log_prob"], expected_log_prob, rtol=1e-5)
  prefixed = module.translate_prefix(tf.constant(INPUTS), tf.constant(_prefixes()))
  assert loaded["prefixed"] == [[o.decode() for o in row] for row in prefixed["outputs"].numpy()]
  np.testing.assert_allclose(loaded["prefixed_scores"], prefixed["scores"].numpy(), rtol=1e-5)

  # align: the same best translation, with attention rows over the pieces read and written
  assert loaded["align_outputs"] == loaded["outputs"]
  attention = np.array(loaded["attention"])
  for row, (source, target) in enumerate(zip(loaded["source_tokens"], loaded["target_tokens"])):
    real_source = np.array([piece != "" for piece in source])
    real_target = np.array([piece != "" for piece in target])
    if loaded["outputs"][row] == "" and INPUTS[row].strip() == "":
      np.testing.assert_array_equal(attention[row], 0.0)
      continue
    assert source[real_source.sum() - 1] == "</s>"
    if "</s>" in target:  # ended: </s> is its last piece
      assert target.index("</s>") == real_target.sum() - 1
    else:  # stopped at its length limit: source pieces (</s> included) + extra_decode_length
      assert real_target.sum() == real_source.sum() + 5, (source, target)
    np.testing.assert_allclose(attention[row][real_target].sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(attention[row][:, ~real_source], 0.0)
    np.testing.assert_array_equal(attention[row][~real_target], 0.0)


def _variable_bytes(version) -> dict:
  """{dtype name: bytes} of all the variables saved in a SavedModel version folder."""
  reader = tf.train.load_checkpoint(str(version / "variables" / "variables"))
  shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
  sizes = {}
  for name, dtype in dtypes.items():
    if dtype != tf.string:  # the object graph
      sizes[dtype.name] = sizes.get(dtype.name, 0) + dtype.size * int(np.prod(shapes[name]))
  return sizes


@pytest.mark.parametrize("precision", ["int8", "bfloat16"])
def test_reduced_precision_export_loads_with_only_tensorflow(model_dir, exported, tmp_path,
                                                             precision):
  result = export(model_dir, tmp_path / "e", f"--precision={precision}")
  assert result.returncode == 0, result.stderr
  version = tmp_path / "e" / "1"
  settings = json.loads((version / "assets.extra" / "decoding.json").read_text())
  assert settings["precision"] == precision
  # the matrices are stored in `precision` only: their float32 originals are not saved
  low, full = _variable_bytes(version), _variable_bytes(exported / "1")
  assert precision not in full and precision in low
  assert low["float32"] + low[precision] < (0.45 if precision == "int8" else 0.65) * full["float32"]

  fresh = testutil.run_python(_FRESH_PROCESS, str(version), json.dumps(INPUTS),
                              json.dumps(_prefixes()), cwd="/")
  assert fresh.returncode == 0, fresh.stderr
  loaded = json.loads(fresh.stdout.strip().splitlines()[-1])
  model, vocabulary, _ = inference.load_for_inference(str(model_dir), "en", "de")
  # compiled by XLA as the export is: a rounding step of int8 or bfloat16 turns the last bit of
  # a float32 difference between XLA and TensorFlow's kernels into a visible one
  module = Translator(model, vocabulary, beam_size=2, nbest=2, max_length=32,
                      extra_decode_length=5, decode_jit=True, precision=precision)
  expected = module.serve(tf.constant(INPUTS))
  assert loaded["outputs"] == [o.decode() for o in expected["outputs"].numpy()]
  np.testing.assert_allclose(loaded["scores"], expected["scores"].numpy(), rtol=1e-5)
  assert loaded["outputs"][1] == "" and loaded["many"] == 1000
  assert loaded["nbest_shape"] == [len(INPUTS), 2] and loaded["log_prob"][0] < 0


@pytest.fixture(scope="module")
def serving_default(loaded):
  return loaded.signatures["serving_default"]


@pytest.mark.parametrize("inputs, message", [
    (tf.constant([1, 2]), "string"),  # the wrong dtype: named in the error
    # rank 0 and rank 2: the signature's [None] is checked when the request runs
    (tf.constant("aa bb"), r"Shape of tensor inputs \[\] is not compatible with expected "
                           r"shape \[\?\]"),
    (tf.constant([["aa"], ["bb"]]), r"Shape of tensor inputs \[2,1\] is not compatible"),
])
def test_malformed_request_is_refused(serving_default, inputs, message):
  with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError), match=message):
    serving_default(inputs=inputs)


def test_score_refuses_sources_and_targets_of_different_counts(loaded):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="score: source and target must have the same number of rows"):
    loaded.signatures["score"](source=tf.constant(["aa", "bb"]), target=tf.constant(["aa"]))


def _with_peak_memory(fn):
  """(fn(), how much this process's resident memory grew at its peak during fn, in bytes),
  the resident memory sampled every millisecond (Linux: /proc/self/statm)."""
  page = os.sysconf("SC_PAGE_SIZE")

  def resident():
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * page

  start, peak, done = resident(), [0], threading.Event()

  def sample():
    while not done.is_set():
      peak[0] = max(peak[0], resident())
      time.sleep(0.001)

  sampler = threading.Thread(target=sample)
  sampler.start()
  try:
    result = fn()
  finally:
    done.set()
    sampler.join()
  return result, max(peak[0], resident()) - start


@pytest.mark.parametrize("rows", [0, 10_000])
def test_empty_and_large_requests_translate_every_row(serving_default, rows):
  inputs = tf.constant([f"aa bb {'cc ' * (i % 7)}" for i in range(rows)], tf.string)
  if rows:  # the request's batch shapes decoded once (compiled), then a batch of 64 measured
    for batch in (inputs[:64], inputs[:rows % 64]):
      serving_default(inputs=batch)
    _, batch_growth = _with_peak_memory(lambda: serving_default(inputs=inputs[:64]))
  result, growth = _with_peak_memory(lambda: serving_default(inputs=inputs))
  assert result["outputs"].shape == (rows,) and result["scores"].shape == (rows,)
  if rows:
    assert result["outputs"][0].numpy() == result["outputs"][7].numpy()  # the same input
    # decoded 64 rows at a time: no more memory than a batch of 64, but for the request and
    # its answer (10,000 short strings each): under 1 MB here, 600 MB for the rows at once
    print(f"resident memory growth: {batch_growth / 2**20:.1f} MiB for 64 rows, "
          f"{growth / 2**20:.1f} MiB for {rows}")
    assert growth < batch_growth + 16 * 2**20


@pytest.mark.parametrize("args, message", [
    (["--beam_size=0"], "error: flag --beam_size=0: 0 is not a positive integer "
                        "(see --helpfull)"),
    (["--alpha=-0.5"], "error: flag --alpha=-0.5: must be a finite number >= 0 (see --helpfull)"),
])
def test_bad_flags_are_one_line_errors(model_dir, tmp_path, args, message):
  testutil.assert_one_line_error(export(model_dir, tmp_path / "e", *args), message)


def test_missing_model_dir_is_one_line_error(tmp_path):
  testutil.assert_one_line_error(export(tmp_path / "nothing", tmp_path / "e"),
                                 f"error: {tmp_path}/nothing: no such directory")


def test_a_trained_export_ends_translations_and_cuts_long_inputs(reversal_model, reversal_export):
  """align on a model that ends its translations: each target row is its pieces then </s>, and
  a source over the export's --max_length=10 is cut to its first 10 pieces + </s>."""
  model_dir, dev, _ = reversal_model
  long_source = " ".join(f"w{n % 13}" for n in range(15))
  sources = [source for source, _ in dev[:6]] + [long_source]
  pieces = spm.SentencePieceProcessor(model_file=str(model_dir / "spm.joint.model"))
  align = tf.saved_model.load(str(reversal_export)).signatures["align"]
  result = {name: value.numpy() for name, value in align(inputs=tf.constant(sources)).items()}
  reversed_rows = 0
  for row, text in enumerate(sources):
    source = [piece.decode() for piece in result["source_tokens"][row] if piece]
    target = [piece.decode() for piece in result["target_tokens"][row] if piece]
    assert source == pieces.encode(text, out_type=str)[:10] + ["</s>"]
    assert target[-1] == "</s>" and "</s>" not in target[:-1], target
    output = result["outputs"][row].decode()
    assert "".join(target[:-1]).replace("▁", " ").split() == output.split()
    reversed_rows += row < 6 and output.split() == text.split()[::-1]
    attention = result["attention"][row][:len(target), :len(source)]
    np.testing.assert_allclose(attention.sum(axis=1), 1.0, atol=1e-5)
  assert reversed_rows >= 3  # trained to reverse: most dev sentences come back reversed


# below the reversal model's vocabulary size (checked): the shortlist leaves pieces out
REVERSAL_SHORTLIST, REVERSAL_PER_SOURCE = 16, 4


@pytest.fixture(scope="module")
def reversal_shortlist_export(reversal_model, tmp_path_factory):
  """reversal_model exported as reversal_export is, with a shortlist of its training data."""
  model_dir = reversal_model[0]
  search = testutil.REVERSAL_EXPORT_SEARCH
  result = testutil.run_cli(
      "tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
      f"--model_dir={model_dir}", f"--export_dir={tmp_path_factory.mktemp('shortlist') / 'e'}",
      "--nodecode_jit", f"--data_dir={model_dir.parent}", "--src_lang=src", "--tgt_lang=tgt",
      f"--shortlist_size={REVERSAL_SHORTLIST}", f"--shortlist_per_source={REVERSAL_PER_SOURCE}",
      *(f"--{name}={value}" for name, value in search.items() if name != "nbest"))
  assert result.returncode == 0, result.stderr
  return pathlib.Path(result.stdout.strip().splitlines()[-1])


def test_a_shortlist_export_translates_as_the_whole_vocabulary_with_only_tensorflow(
    reversal_model, reversal_export, reversal_shortlist_export):
  model_dir, dev, _ = reversal_model
  version = reversal_shortlist_export
  settings = json.loads((version / "assets.extra" / "decoding.json").read_text())
  assert settings["shortlist_size"] == REVERSAL_SHORTLIST
  assert settings["shortlist_per_source"] == REVERSAL_PER_SOURCE
  pieces = spm.SentencePieceProcessor(model_file=str(model_dir / "spm.joint.model"))
  assert REVERSAL_SHORTLIST < pieces.get_piece_size()  # a shortlist indeed
  # the lexicon's table is saved, int32 [source pieces, per_source], and the target pieces'
  # frequency order, int32 [target pieces]
  int32_bytes = pieces.get_piece_size() * (REVERSAL_PER_SOURCE + 1) * 4
  assert _variable_bytes(version)["int32"] == int32_bytes
  # and nothing else: its float32 variables are the model's, as in the export without it
  assert _variable_bytes(version)["float32"] == _variable_bytes(reversal_export)["float32"]

  sources = [source for source, _ in dev]
  # forced pieces the training data never wrote (the task's words are w0 .. w12)
  prefixes = ["w13" if row % 2 else "" for row in range(len(sources))]
  fresh = testutil.run_python(_FRESH_PROCESS, str(version), json.dumps(sources),
                              json.dumps(prefixes), cwd="/")
  assert fresh.returncode == 0, fresh.stderr
  loaded = json.loads(fresh.stdout.strip().splitlines()[-1])
  whole = tf.saved_model.load(str(reversal_export)).signatures["serving_default"](
      inputs=tf.constant(sources))
  assert loaded["outputs"] == [output.decode() for output in whole["outputs"].numpy()]
  assert loaded["align_outputs"] == loaded["outputs"]
  reversed_rows = sum(output.split() == source.split()[::-1]
                      for output, source in zip(loaded["outputs"], sources))
  assert reversed_rows >= len(sources) // 2
  for prefix, outputs, scores in zip(prefixes, loaded["prefixed"], loaded["prefixed_scores"]):
    assert all(output.startswith(prefix) for output in outputs)
    assert all(score > -100 for score in scores)  # the forced pieces are in the shortlist
