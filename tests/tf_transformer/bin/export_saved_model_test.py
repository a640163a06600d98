"""export_saved_model's --shortlist_size at the whole vocabulary is no shortlist (its bad
values are rows of tests/bad_input_test.py)."""

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
