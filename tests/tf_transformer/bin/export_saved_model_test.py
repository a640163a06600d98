"""export_saved_model's --shortlist_size at the whole vocabulary is no shortlist, and its
--ensemble (its bad values are rows of tests/bad_input_test.py)."""

import json

from tests import testutil


def export(model_dir, export_dir, *args):
  return testutil.run_cli("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
                          f"--model_dir={model_dir}", f"--export_dir={export_dir}", *args)


def test_a_shortlist_of_the_whole_vocabulary_is_none(tiny_model_dir, tmp_path):
  """--shortlist_size at least the target vocabulary's (60 pieces here): the whole vocabulary,
  so no training data is read (this --data_dir has none) and decoding.json records none."""
  result = export(tiny_model_dir, tmp_path / "e", "--shortlist_size=60", "--nodecode_jit",
                  f"--data_dir={tmp_path / 'data'}")
  assert result.returncode == 0, result.stderr
  settings = json.loads((tmp_path / "e" / "1" / "assets.extra" / "decoding.json").read_text())
  assert settings["shortlist_size"] == 0 and settings["shortlist_per_source"] == 0


def test_an_ensemble_exports_every_members_weights_and_searches_as_the_library(tiny_model_dir,
                                                                                tmp_path):
  """--ensemble=DIR,DIR --ensemble_weights=1,3: one SavedModel with both members' weights (the
  variables of two models) whose search, sampling and score are the library ensemble's; its
  decoding.json names the members and their normalised weights."""
  import numpy as np
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)

  from tf_transformer import inference

  members = f"{tiny_model_dir},{tiny_model_dir}"
  result = testutil.run_cli("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
                            f"--ensemble={members}", "--ensemble_weights=1,3",
                            f"--export_dir={tmp_path / 'e'}", "--nodecode_jit", "--beam_size=2",
                            "--extra_decode_length=4")
  assert result.returncode == 0, result.stderr
  version = result.stdout.strip().splitlines()[-1]
  settings = json.loads((tmp_path / "e" / "1" / "assets.extra" / "decoding.json").read_text())
  assert settings["ensemble"] == [str(tiny_model_dir)] * 2
  assert settings["ensemble_weights"] == [0.25, 0.75]
  single = export(tiny_model_dir, tmp_path / "single", "--nodecode_jit", "--beam_size=2")
  assert single.returncode == 0, single.stderr
  sizes = [sum(int(np.prod(v.shape)) for v in tf.saved_model.load(folder).model_variables)
           for folder in (version, single.stdout.strip().splitlines()[-1])]
  assert sizes[0] == 2 * sizes[1]
  library = inference.load([str(tiny_model_dir)] * 2, weights=(1, 3), beam_size=2,
                           extra_decode_length=4, max_source_length=32)
  texts = ["aa bb", "cc dd ee", "", "ff gg hh ii"]
  exported = inference.load(version)
  testutil.assert_translate_alike(exported, library, texts, nbest=2)
  sampled = dict(strategy="sample", seed=5, sampling_temperature=1.0)
  assert exported.translate(texts, **sampled) == library.translate(texts, **sampled)
  np.testing.assert_allclose(exported.score(texts, texts), library.score(texts, texts),
                             rtol=1e-5)
