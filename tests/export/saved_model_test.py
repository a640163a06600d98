"""The exported SavedModel: layout, signatures, warm-up records, self-contained loading, bad
inputs, CLI errors."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from data_pipeline.token_ids import EOS_ID
from tests import testutil
from tf_transformer import checkpoints, decoding
from tf_transformer.config import DecodeConfig
from tf_transformer.serving import signatures
from tf_transformer.serving.translator import Translator

INPUTS = ["aa bb cc", "", "dd ee", "こんにちは世界", "Tiếng Việt có dấu", "emoji 🙂 \x07 ctl",
          "x" * 5000]
SIGNATURES = ("serving_default", "translate_nbest", "translate_prefix", "translate_constrained",
              "translate_constrained_prefix", "sample", "sample_prefix", "score", "align")


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
  model, _, _ = checkpoints.load_for_inference(str(model_dir), "en", "de")
  weights = sum(v.numpy().nbytes for v in model.variables if v.dtype == "float32")
  assert _variable_bytes(version)["float32"] == weights  # each saved once
  result = export(model_dir, exported, "--signatures=serving_default")  # a plain path, here
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
    if "prefix" in inputs:  # of the narrowest bucket: the programs of the searches without one
      assert set(inputs["prefix"].numpy().tolist()) == {b"Hello."}, name
    batch = {int(tensor.shape[0]) for tensor in inputs.values()}.pop()
    batches.setdefault(name, []).append(batch)
    outputs = signature(**inputs)  # replayed as TF Serving replays it at load
    assert sorted(outputs) == sorted(signature.structured_outputs), name
    assert all(tensor.shape[0] == batch for tensor in outputs.values()), name
  assert batches == {name: [1, 8] for name in SIGNATURES}


def test_saved_model_cli_shows_the_signatures(exported):
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
  result = subprocess.run([cli, "show", "--all", "--dir", str(exported / "1")],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  shown = result.stdout
  for name in SIGNATURES:
    assert f"signature_def['{name}']" in shown
  serving = shown.split("signature_def['serving_default']")[1].split("signature_def[")[0]
  assert "inputs['inputs'] tensor_info:\n        dtype: DT_STRING" in serving
  assert "outputs['outputs'] tensor_info:\n        dtype: DT_STRING" in serving
  assert "outputs['scores'] tensor_info:\n        dtype: DT_FLOAT" in serving
  prefix = shown.split("signature_def['translate_prefix']")[1].split("signature_def[")[0]
  assert "inputs['prefix'] tensor_info:\n        dtype: DT_STRING" in prefix
  sample = shown.split("signature_def['sample']")[1].split("signature_def[")[0]
  assert "inputs['seed'] tensor_info:\n        dtype: DT_INT64\n        shape: (-1)" in sample
  score = shown.split("signature_def['score']")[1].split("signature_def[")[0]
  assert "outputs['log_prob'] tensor_info:\n        dtype: DT_FLOAT" in score
  align = shown.split("signature_def['align']")[1].split("signature_def[")[0]
  assert "outputs['attention'] tensor_info:\n        dtype: DT_FLOAT\n        shape: (-1, -1, -1)" \
      in align


def test_saving_traces_no_function_a_second_time(model_dir, tmp_path):
  """The SavedModel serves the concrete functions of Translator.signatures(): saving it traces
  none of the module's tf.functions again (under the save's variable policy, which doubled an
  export's tracing), and the loaded object has the signatures and the weights, not them."""
  model, vocabulary, _ = checkpoints.load_for_inference(str(model_dir), "en", "de")
  module = Translator(model, vocabulary, DecodeConfig(beam_size=2, nbest=2))
  signatures = module.signatures()
  functions = [getattr(module, name) for name in (
      "serve", "translate_nbest", "translate_prefix", "translate_constrained",
      "translate_constrained_prefix", "sample", "sample_prefix", "score", "align")]
  functions += list(module._searches.value.functions.values())
  traced = [function.experimental_get_tracing_count() for function in functions]
  tf.saved_model.save(module, str(tmp_path / "saved"), signatures=signatures)
  assert [function.experimental_get_tracing_count() for function in functions] == traced
  loaded = tf.saved_model.load(str(tmp_path / "saved"))
  assert sorted(loaded.signatures) == sorted(SIGNATURES)
  assert not hasattr(loaded, "serve")
  assert len(loaded.model_variables) == len(module.model_variables)


def _prefixes() -> list[str]:
  """A target prefix per INPUTS row: every other one empty."""
  return ["ss tt" if row % 2 == 0 else "" for row in range(len(INPUTS))]


def test_fresh_process_with_only_tensorflow_translates_like_the_library(model_dir, exported):
  loaded = testutil.run_export_fresh(exported / "1", INPUTS, _prefixes(), term="aa")
  model, vocabulary, _ = checkpoints.load_for_inference(str(model_dir), "en", "de")
  module = Translator(model, vocabulary, DecodeConfig(beam_size=2, nbest=2, max_source_length=32,
                                                     extra_decode_length=5))
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
  seeds = tf.range(len(INPUTS), dtype=tf.int64)
  sampled = module.sample(tf.constant(INPUTS), seeds)
  assert loaded["sampled"] == [o.decode() for o in sampled["outputs"].numpy()]
  np.testing.assert_allclose(loaded["sampled_scores"], sampled["scores"].numpy(), rtol=1e-5)
  sampled_prefix = module.sample_prefix(tf.constant(INPUTS), tf.constant(_prefixes()), seeds)
  assert loaded["sampled_prefix"] == [o.decode() for o in sampled_prefix["outputs"].numpy()]
  assert all(output.startswith(prefix) for output, prefix, text in zip(
      loaded["sampled_prefix"], _prefixes(), INPUTS) if text.strip())
  # the constrained signatures: the term in every output of the first row, each output of
  # the second search after its prefix; as the library's
  terms = tf.constant(["aa"] + [""] * (len(INPUTS) - 1))
  for name, result in (("constrained", module.translate_constrained(tf.constant(INPUTS), terms)),
                       ("constrained_prefix", module.translate_constrained_prefix(
                           tf.constant(INPUTS), terms, tf.constant(_prefixes())))):
    assert loaded[name] == [[o.decode() for o in row] for row in result["outputs"].numpy()], name
    assert all("aa" in output.split() for output in loaded[name][0]), loaded[name][0]
  assert all(output.startswith("ss tt") for output in loaded["constrained_prefix"][0])

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


def _request(name: str, rows: int) -> dict:
  """A request of `rows` rows to signature `name`: short texts of 2-8 words in its text
  inputs, no prefix, no constraint, seeds 0-6 (each row the same as the row 7 below it)."""
  texts = tf.constant([f"aa bb {'cc ' * (i % 7)}" for i in range(rows)], tf.string)
  values = {signatures.TEXTS: texts, signatures.PREFIX: tf.fill([rows], ""),
            signatures.NO_CONSTRAINT: tf.fill([rows], ""),
            signatures.ROW_INDEX: tf.range(rows, dtype=tf.int64) % 7}
  return {tensor.name: values[tensor.warmup] for tensor in signatures.BY_NAME[name].inputs}


@pytest.mark.parametrize("name", signatures.NAMES)
@pytest.mark.parametrize("rows", [0, 10_000])
def test_empty_and_large_requests_answer_every_row(loaded, name, rows):
  function = loaded.signatures[name]
  request = _request(name, rows)
  if rows:  # the request's batch shapes decoded once (compiled), then a batch of 64 measured
    for part in (slice(0, 64), slice(0, rows % 64)):
      function(**{key: value[part] for key, value in request.items()})
    _, batch_growth = testutil.peak_memory_growth(
        lambda: function(**{key: value[:64] for key, value in request.items()}))
  result, growth = testutil.peak_memory_growth(lambda: function(**request))
  assert {key: value.shape[0] for key, value in result.items()} == {key: rows for key in result}
  if rows:
    for value in result.values():
      np.testing.assert_array_equal(value[0].numpy(), value[7].numpy())
    # decoded 64 rows at a time: no more memory than a batch of 64, but for the request and
    # its answer (under 1 MB here but for align's attention, 600 MB for the rows at once)
    answer = sum(sum(map(len, value.numpy().ravel())) if value.dtype == tf.string
                 else value.numpy().nbytes for value in result.values())
    print(f"{name}: resident memory growth: {batch_growth / 2**20:.1f} MiB for 64 rows, "
          f"{growth / 2**20:.1f} MiB for {rows}, an answer of {answer / 2**20:.1f} MiB")
    assert growth < batch_growth + 2 * answer + 16 * 2**20


def test_empty_constraints_translate_as_translate_nbest_bit_for_bit_under_xla(loaded):
  """The XLA export (decode_jit, the default): the constrained search's programs, given no
  phrase, give translate_nbest's outputs and scores exactly."""
  inputs = tf.constant([f"aa bb {'cc dd ' * i}" for i in range(6)] + [""])
  plain = loaded.signatures["translate_nbest"](inputs=inputs)
  for name, extra in (("translate_constrained", {}),
                      ("translate_constrained_prefix", {"prefix": tf.fill([7], "")})):
    constrained = loaded.signatures[name](inputs=inputs, constraints=tf.fill([7], ""), **extra)
    assert constrained["outputs"].numpy().tolist() == plain["outputs"].numpy().tolist(), name
    assert constrained["scores"].numpy().tobytes() == plain["scores"].numpy().tobytes(), name


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


def _export_reversal(model_dir, export_dir, *args) -> pathlib.Path:
  """reversal_model (its folder `model_dir`) exported to `export_dir` as reversal_export is
  (without XLA, testutil.REVERSAL_EXPORT_SEARCH's search), with the flags `args`: the version
  folder."""
  result = testutil.run_cli(
      "tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
      f"--model_dir={model_dir}", f"--export_dir={export_dir}", "--nodecode_jit",
      *testutil.REVERSAL_EXPORT_FLAGS, *args)
  assert result.returncode == 0, result.stderr
  return pathlib.Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reversal_exports(reversal_model, reversal_export, tmp_path_factory):
  """{precision: version folder}: reversal_export (float32), and reversal_model exported as it
  is in int8 and in bfloat16."""
  return {"float32": reversal_export, **{
      precision: _export_reversal(reversal_model[0], tmp_path_factory.mktemp(precision) / "e",
                                  f"--precision={precision}")
      for precision in ("int8", "bfloat16")}}


@pytest.mark.parametrize("precision", ["int8", "bfloat16"])
def test_reduced_precision_export_loads_with_only_tensorflow(reversal_model, reversal_exports,
                                                             precision):
  """reversal_model's int8 and bfloat16 exports: their matrices stored in `precision` only, and
  a process with nothing but tensorflow translates with them as the library's search in that
  precision."""
  version = reversal_exports[precision]
  settings = json.loads((version / "assets.extra" / "decoding.json").read_text())
  assert settings["precision"] == precision
  # the matrices are stored in `precision` only: their float32 originals are not saved
  low, full = _variable_bytes(version), _variable_bytes(reversal_exports["float32"])
  assert precision not in full and precision in low
  assert low["float32"] + low[precision] < (0.45 if precision == "int8" else 0.65) * full["float32"]

  loaded = testutil.run_export_fresh(version, INPUTS, _prefixes())
  model, vocabulary, _ = checkpoints.load_for_inference(str(reversal_model[0]), "src", "tgt")
  module = Translator(model, vocabulary, testutil.REVERSAL_EXPORT_SEARCH, precision=precision)
  expected = module.serve(tf.constant(INPUTS))
  assert loaded["outputs"] == [o.decode() for o in expected["outputs"].numpy()]
  np.testing.assert_allclose(loaded["scores"], expected["scores"].numpy(), rtol=1e-5)
  assert loaded["outputs"][1] == "" and loaded["many"] == 1000
  assert loaded["nbest_shape"] == [len(INPUTS), 2] and loaded["log_prob"][0] < 0


# how far a trained model's int8 and bfloat16 exports may stray from its float32 export over
# the reversal dev set (30 sentences): (the share of best translations that must be the same,
# the largest difference of their scores where they are, the largest difference of the
# references' log-probabilities, `score`). Measured: both the same on all 30; scores at most
# 0.063 apart in int8 (0.008 on average) and 0.010 in bfloat16 (0.002), log-probabilities
# (-0.01 to -10.4) 0.123 (0.021) and 0.054 (0.007). int8 scales 10% off: 21 of 30 the same,
# scores 0.29 apart, log-probabilities 4.2.
PRECISION_PARITY = {"int8": (0.9, 0.15, 0.3), "bfloat16": (0.9, 0.03, 0.15)}


def test_reduced_precision_exports_translate_the_dev_set_as_float32(reversal_model,
                                                                    reversal_exports):
  """A trained model's int8 and bfloat16 exports against its float32 export: the same best
  translations for nearly all dev sentences, with nearly the same scores, and nearly the same
  log-probabilities of the references."""
  _, dev, _ = reversal_model
  sources, targets = (tf.constant(side) for side in zip(*dev))
  results = {}
  for precision, version in reversal_exports.items():
    signatures = tf.saved_model.load(str(version)).signatures
    best = signatures["serving_default"](inputs=sources)
    log_prob = signatures["score"](source=sources, target=targets)["log_prob"]
    results[precision] = (np.array([output.decode() for output in best["outputs"].numpy()]),
                          best["scores"].numpy(), log_prob.numpy())
  outputs, scores, log_prob = results["float32"]
  for precision, (share, score_tolerance, log_prob_tolerance) in PRECISION_PARITY.items():
    low_outputs, low_scores, low_log_prob = results[precision]
    same = low_outputs == outputs
    print(f"{precision}: {same.sum()} of {len(dev)} translations the same, scores "
          f"{np.abs(low_scores - scores)[same].max():.5f} apart, log-probabilities "
          f"{np.abs(low_log_prob - log_prob).max():.5f}")
    assert same.mean() >= share, precision
    np.testing.assert_allclose(low_scores[same], scores[same], rtol=0, atol=score_tolerance)
    np.testing.assert_allclose(low_log_prob, log_prob, rtol=0, atol=log_prob_tolerance)


# one sentence a request: its shortlist of 9 of the 20 pieces holds EOS and its words' pieces
# (a number piece's 2 candidates are itself and "▁w"), not all those the dev set writes
REVERSAL_SHORTLIST, REVERSAL_PER_SOURCE = 9, 2


@pytest.fixture(scope="module")
def reversal_shortlist_export(reversal_model, tmp_path_factory):
  """reversal_model exported as reversal_export is, in int8, with a shortlist of its training
  data."""
  model_dir = reversal_model[0]
  return _export_reversal(
      model_dir, tmp_path_factory.mktemp("shortlist") / "e", "--precision=int8",
      f"--data_dir={model_dir.parent}", "--src_lang=src", "--tgt_lang=tgt",
      f"--shortlist_size={REVERSAL_SHORTLIST}", f"--shortlist_per_source={REVERSAL_PER_SOURCE}")


def test_an_int8_shortlist_export_translates_as_the_whole_vocabulary_with_only_tensorflow(
    reversal_model, reversal_exports, reversal_shortlist_export):
  """An int8 export with a shortlist loads with only tensorflow and tensorflow_text and
  translates as the int8 export without one: the whole dev set in one request, and each
  sentence alone (a shortlist of REVERSAL_SHORTLIST pieces a sentence, which a forced
  prefix's pieces enter)."""
  model_dir, dev, _ = reversal_model
  version, whole_version = reversal_shortlist_export, reversal_exports["int8"]
  settings = json.loads((version / "assets.extra" / "decoding.json").read_text())
  assert settings["shortlist_size"] == REVERSAL_SHORTLIST and settings["precision"] == "int8"
  assert settings["shortlist_per_source"] == REVERSAL_PER_SOURCE
  pieces = spm.SentencePieceProcessor(model_file=str(model_dir / "spm.joint.model"))
  # the lexicon's table is saved, int32 [source pieces, per_source], and the target pieces'
  # frequency order, int32 [target pieces]
  int32_bytes = pieces.get_piece_size() * (REVERSAL_PER_SOURCE + 1) * 4
  assert _variable_bytes(version)["int32"] == int32_bytes
  # and nothing else: its other variables are the model's, as in the export without it
  assert _variable_bytes(version) == {**_variable_bytes(whole_version), "int32": int32_bytes}

  sources = [source for source, _ in dev]
  written = {piece for _, target in dev for piece in pieces.encode(target)} | {EOS_ID}
  assert len(written) > REVERSAL_SHORTLIST  # a shortlist indeed
  # a word the training data never wrote (its words are w0 .. w12): its pieces forced
  prefixes = ["w13" if row % 2 else "" for row in range(len(sources))]
  # the whole dev set in one request (each sentence its own shortlist of 9 pieces), in a
  # process of its own
  loaded = testutil.run_export_fresh(version, sources, prefixes)
  shortlisted = tf.saved_model.load(str(version)).signatures
  whole = tf.saved_model.load(str(whole_version)).signatures
  expected = whole["serving_default"](inputs=tf.constant(sources))
  assert loaded["outputs"] == [output.decode() for output in expected["outputs"].numpy()]
  assert loaded["align_outputs"] == loaded["outputs"]
  reversed_rows = sum(output.split() == source.split()[::-1]
                      for output, source in zip(loaded["outputs"], sources))
  assert reversed_rows >= len(sources) // 2
  for prefix, outputs in zip(prefixes, loaded["prefixed"]):
    assert all(output.startswith(prefix) for output in outputs)

  # one sentence a request: a shortlist of 9 pieces, its scores normalised over them higher
  # than the whole vocabulary's, and the prefix's pieces in it
  for source, prefix in zip(sources, prefixes):
    inputs = tf.constant([source])
    got, want = (signatures["serving_default"](inputs=inputs)
                 for signatures in (shortlisted, whole))
    assert got["outputs"].numpy()[0] == want["outputs"].numpy()[0], source
    assert got["scores"].numpy()[0] > want["scores"].numpy()[0], source  # by 0.002 to 0.03
    if prefix:
      prefixed = shortlisted["translate_prefix"](inputs=inputs, prefix=tf.constant([prefix]))
      assert all(output.decode().startswith(prefix) for output in prefixed["outputs"][0].numpy())
      assert (prefixed["scores"].numpy() > -100).all(), source  # not masked out (about -1e9)


def test_a_relative_position_model_exports_and_translates_as_its_model_directory(tmp_path):
  """A random model of relative positions (tiny dims): its XLA-compiled export gives the
  translations and scores of the model directory's own search, and scores as it does."""
  import keras

  import tf_transformer
  from data_pipeline import tokenizer
  from tf_transformer import model_dir as model_dir_lib
  from tf_transformer.config import ModelConfig
  from tf_transformer.model import build_model

  model_dir = tmp_path / "model"
  sentences = [" ".join(chr(97 + (i * j) % 26) * 2 for j in range(1, 6)) for i in range(300)]
  tokenizer.train_sentencepiece(sentences, str(model_dir / "spm.joint.model"), 60)
  size = tokenizer.load_tokenizer(str(model_dir / "spm.joint.model")).vocab_size().numpy()
  config = ModelConfig(int(size), int(size), num_layers=2, d_model=32, num_heads=4, d_ff=64,
                       position_encoding="relative", max_relative_position=3)
  model_dir_lib.check_config(str(model_dir), config)
  keras.utils.set_random_seed(3)
  tf.train.Checkpoint(model=build_model(config)).save(str(model_dir / "ckpt"))
  flags = ("--beam_size=2", "--max_length=10", "--extra_decode_length=5")
  result = testutil.run_cli("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
                            f"--model_dir={model_dir}", f"--export_dir={tmp_path / 'export'}",
                            "--signatures=translate_nbest,score", *flags)
  assert result.returncode == 0, result.stderr
  version = result.stdout.strip().splitlines()[-1]
  sources = ["aa bb cc dd", "ee ff", "gg hh ii jj kk ll mm"]
  exported = tf_transformer.load(version)
  library = tf_transformer.load(str(model_dir), beam_size=2, max_source_length=10,
                                extra_decode_length=5)
  ours, theirs = (model.translate(sources, nbest=2) for model in (library, exported))
  for mine, its in zip(ours, theirs):
    assert [h.text for h in mine] == [h.text for h in its]
    np.testing.assert_allclose([h.score for h in mine], [h.score for h in its], atol=1e-4)
  targets = [hypotheses[0].text for hypotheses in ours]
  np.testing.assert_allclose(library.score(sources, targets), exported.score(sources, targets),
                             atol=1e-4)
