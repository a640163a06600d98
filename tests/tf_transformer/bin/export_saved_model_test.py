"""export_saved_model's --shortlist_size at the whole vocabulary is no shortlist, and its
--ensemble (its bad values are rows of tests/bad_input_test.py)."""

import json

import pytest

from tests import testutil


def export(model_dir, export_dir, *args):
  return testutil.run_cli("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
                          f"--model_dir={model_dir}", f"--export_dir={export_dir}", *args)


def test_a_shortlist_of_the_whole_vocabulary_is_none(tiny_model_dir, tmp_path):
  """--shortlist_size at least the target vocabulary's (60 pieces here): the whole vocabulary,
  so no training data is read (this --data_dir has none) and decoding.json records none."""
  result = export(tiny_model_dir, tmp_path / "e", "--shortlist_size=60", "--nodecode_jit",
                  f"--data_dir={tmp_path / 'data'}", "--signatures=serving_default")
  assert result.returncode == 0, result.stderr
  settings = json.loads((tmp_path / "e" / "1" / "assets.extra" / "decoding.json").read_text())
  assert settings["shortlist_size"] == 0 and settings["shortlist_per_source"] == 0


def test_an_ensemble_exports_every_members_weights_and_searches_as_the_library(
    tiny_model_dir, other_tiny_model_dir, tmp_path):
  """--ensemble=A,B --ensemble_weights=1,3: one SavedModel with both members' weights (the
  variables of two models) whose search, sampling and score are the library ensemble's; its
  decoding.json names the members and their normalised weights."""
  import numpy as np
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)

  from tf_transformer import checkpoints, loading

  members = f"{tiny_model_dir},{other_tiny_model_dir}"
  result = testutil.run_cli("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
                            f"--ensemble={members}", "--ensemble_weights=1,3",
                            f"--export_dir={tmp_path / 'e'}", "--nodecode_jit", "--beam_size=2",
                            "--extra_decode_length=4")
  assert result.returncode == 0, result.stderr
  version = result.stdout.strip().splitlines()[-1]
  settings = json.loads((tmp_path / "e" / "1" / "assets.extra" / "decoding.json").read_text())
  assert settings["ensemble"] == [str(tiny_model_dir), str(other_tiny_model_dir)]
  assert settings["ensemble_weights"] == [0.25, 0.75]
  member = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")[0]
  weights = [v for v in tf.saved_model.load(version).model_variables
             if "seed_generator" not in v.name]  # the dropout layers' seeds are no weights
  assert sum(int(np.prod(v.shape)) for v in weights) == (
      2 * sum(int(np.prod(v.shape)) for v in member.weights))
  library = loading.load([str(tiny_model_dir), str(other_tiny_model_dir)], weights=(1, 3),
                         beam_size=2, extra_decode_length=4, max_source_length=32)
  texts = ["aa bb", "cc dd ee", "", "ff gg hh ii"]
  exported = loading.load(version)
  testutil.assert_translate_alike(exported, library, texts, nbest=2)
  sampled = dict(strategy="sample", seed=5, sampling_temperature=1.0)
  assert exported.translate(texts, **sampled) == library.translate(texts, **sampled)
  np.testing.assert_allclose(exported.score(texts, texts), library.score(texts, texts),
                             rtol=1e-5)
  # a process with nothing but tensorflow and tensorflow_text loads it and searches alike
  fresh = testutil.run_export_fresh(version, texts, ["", "ss", "", ""], term="aa")
  assert fresh["outputs"] == library.translate(texts)
  with_term = library.translate(texts, nbest=2, constraints=[["aa"], [], [], []])
  assert fresh["constrained"] == [[h.text for h in row] if text else ["", ""]
                                  for row, text in zip(with_term, texts)]


def test_the_repetition_controls_are_compiled_into_an_export_as_the_library_applies_them(
    tiny_model_dir, tmp_path):
  """--no_repeat_ngram_size=1 --repetition_penalty=1.5: recorded in decoding.json, fixed in the
  export's beam search and sampling, whose outputs are the library's under the same settings
  (and translate's with the same flags): no target piece twice, unlike the model's own. The
  export's sampling flags (given without --strategy=sample: they are its `sample` signatures')
  are recorded and drawn with as the library draws, unlike the default ones."""
  import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)

  from tf_transformer import checkpoints, loading
  from tf_transformer.model_dir import ModelDirError

  controls = dict(no_repeat_ngram_size=1, repetition_penalty=1.5)
  sampling = dict(sampling_topk=3, sampling_topp=0.9, sampling_temperature=0.5)
  result = export(tiny_model_dir, tmp_path / "e", "--nodecode_jit", "--beam_size=2",
                  "--extra_decode_length=6", "--signatures=translate_nbest,sample",
                  *(f"--{name}={value}" for name, value in {**controls, **sampling}.items()))
  assert result.returncode == 0, result.stderr
  settings = json.loads((tmp_path / "e" / "1" / "assets.extra" / "decoding.json").read_text())
  assert {name: settings[name] for name in {**controls, **sampling}} == {**controls, **sampling}
  texts = ["aa bb", "cc dd ee", "", "ff gg hh ii jj kk"]
  search = dict(beam_size=2, extra_decode_length=6, max_source_length=32)
  library = loading.load(str(tiny_model_dir), **search, **controls)
  exported = loading.load(result.stdout.strip().splitlines()[-1])
  testutil.assert_translate_alike(exported, library, texts, nbest=2)
  draws = dict(strategy="sample", seed=5, nbest=3)
  exported_draws = exported.translate(texts, **draws)
  assert exported_draws == library.translate(texts, **draws, **sampling)
  assert exported_draws != library.translate(texts, **draws)
  target = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")[1].target
  outputs = library.translate(texts)
  plain = loading.load(str(tiny_model_dir), **search).translate(texts)
  pieces = [list(target.tokenize(text).numpy()) for text in outputs]
  assert all(len(set(row)) == len(row) for row in pieces), pieces
  assert outputs != plain
  translated = testutil.run_cli("tf_transformer.bin.translate", "--flagfile=flags/tiny.cfg",
                                f"--model_dir={tiny_model_dir}", "--beam_size=2",
                                "--extra_decode_length=6",
                                *(f"--{name}={value}" for name, value in controls.items()),
                                stdin="\n".join(texts) + "\n")
  assert translated.returncode == 0, translated.stderr
  assert translated.stdout.splitlines() == outputs
  # a SavedModel's controls are fixed at export
  with pytest.raises(ModelDirError, match="no_repeat_ngram_size=1 is fixed"):
    exported.translate(texts, no_repeat_ngram_size=2)


def test_an_export_of_some_signatures_serves_those_and_refuses_the_rest_in_one_line(
    tiny_model_dir, tmp_path):
  """--signatures=score,serving_default: the SavedModel has those two and their warm-up
  requests only, and decoding.json names them; load() scores as the library, and a call that
  needs another signature fails in one line naming them. An unknown name is a flag error."""
  import numpy as np
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)
  from tensorflow_serving.apis import prediction_log_pb2

  from tf_transformer import loading
  from tf_transformer.model_dir import ModelDirError

  result = export(tiny_model_dir, tmp_path / "e", "--nodecode_jit", "--beam_size=2",
                  "--signatures=score,serving_default")
  assert result.returncode == 0, result.stderr
  version = result.stdout.strip().splitlines()[-1]
  assert sorted(tf.saved_model.load(version).signatures) == ["score", "serving_default"]
  settings = json.loads((tmp_path / "e" / "1" / "assets.extra" / "decoding.json").read_text())
  assert settings["signatures"] == ["serving_default", "score"]
  records = tf.data.TFRecordDataset(f"{version}/assets.extra/tf_serving_warmup_requests")
  warmed = {prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
            .model_spec.signature_name for record in records}
  assert warmed == {"score", "serving_default"}
  texts = ["aa bb", "cc dd ee", ""]
  exported = loading.load(version)
  library = loading.load(str(tiny_model_dir), beam_size=2, max_source_length=32)
  np.testing.assert_allclose(exported.score(texts, texts), library.score(texts, texts),
                             rtol=1e-5)
  with pytest.raises(ModelDirError, match=r"/1: exported with the signatures serving_default, "
                     r"score only, not 'translate_nbest' \(export the model again with it\)"):
    exported.translate(texts)
  testutil.assert_one_line_error(
      export(tiny_model_dir, tmp_path / "f", "--signatures=serving_default,translate"),
      "error: --signatures=serving_default,translate: no signature translate (the signatures: "
      "serving_default, translate_nbest, translate_prefix, translate_constrained, "
      "translate_constrained_prefix, sample, sample_prefix, score, align)")
