"""tf_transformer/model_dir.py: what a model directory records is checked on every rerun; JSON
files are replaced whole; any TensorFlow file system works (file:// here)."""

import dataclasses
import json
import os

import pytest

from tf_transformer import checkpoints
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import DataConfig, ModelConfig

MODEL = ModelConfig(100, 100, num_layers=2, d_model=32, num_heads=4, d_ff=64)
DATA = DataConfig(data_dir="data", src_lang="en", tgt_lang="de", vocab_size=100)


def _changed(value):
  if isinstance(value, bool):
    return not value
  if isinstance(value, (int, float)):
    return value * 2 if value else 0.5
  return {"post": "pre", "en": "fr", "de": "vi", "unigram": "bpe", "relu": "swish",
          "interleaved": "halves"}[value]


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(ModelConfig)
                                   if f.name not in ("position_encoding",
                                                     "max_relative_position")])
def test_rerun_with_another_architecture_is_refused(tmp_path, field):
  model_dir_lib.check_config(str(tmp_path), MODEL)
  model_dir_lib.check_config(str(tmp_path), MODEL)  # the same flags: accepted
  old = getattr(MODEL, field)
  new = dataclasses.replace(MODEL, **{field: _changed(old)})
  with pytest.raises(model_dir_lib.ModelDirError) as error:
    model_dir_lib.check_config(str(tmp_path), new)
  assert str(error.value) == (
      f"{tmp_path}/config.json: this model was created with {field}={old!r}; the settings now "
      f"give {field}={getattr(new, field)!r} (the architecture); use the same settings or "
      "another model_dir")
  assert error.value.as_flags().endswith("use the same settings or another --model_dir")


def test_rerun_with_relative_positions_is_refused(tmp_path):
  """The two position fields change together (each alone is not a ModelConfig)."""
  model_dir_lib.check_config(str(tmp_path), MODEL)
  relative = dataclasses.replace(MODEL, position_encoding="relative", max_relative_position=16)
  with pytest.raises(model_dir_lib.ModelDirError) as error:
    model_dir_lib.check_config(str(tmp_path), relative)
  assert str(error.value) == (
      f"{tmp_path}/config.json: this model was created with max_relative_position=0, "
      "position_encoding='sinusoidal'; the settings now give max_relative_position=16, "
      "position_encoding='relative' (the architecture); use the same settings or another "
      "model_dir")


@pytest.mark.parametrize("field", ["src_lang", "tgt_lang", "vocab_size", "spm_model_type",
                                   "spm_byte_fallback", "shared_vocab"])
def test_rerun_with_another_vocabulary_is_refused(tmp_path, field):
  model_dir_lib.check_data(str(tmp_path), DATA)
  (tmp_path / "spm.joint.model").write_bytes(b"trained by the first run")
  model_dir_lib.check_data(str(tmp_path), dataclasses.replace(DATA, batch_tokens=99))
  old = getattr(DATA, field)
  new = dataclasses.replace(DATA, **{field: _changed(old)})
  with pytest.raises(model_dir_lib.ModelDirError) as error:
    model_dir_lib.check_data(str(tmp_path), new)
  assert str(error.value) == (
      f"{tmp_path}/data.json: this model was created with {field}={old!r}; the settings now "
      f"give {field}={getattr(new, field)!r} (the vocabulary); use the same settings or "
      "another model_dir")


def test_a_record_no_subword_model_was_built_on_yields_to_the_flags(tmp_path):
  """A run refused before its subword models (too small a --vocab_size, say) leaves its
  data.json: the rerun with the flag mended goes on, and is then held to its own record."""
  model_dir_lib.check_data(str(tmp_path), DATA)
  mended = dataclasses.replace(DATA, vocab_size=300)
  model_dir_lib.check_data(str(tmp_path), mended)
  assert model_dir_lib.read_data(str(tmp_path))["vocab_size"] == 300
  (tmp_path / "spm.joint.model").write_bytes(b"trained by the mended run")
  with pytest.raises(model_dir_lib.ModelDirError, match="created with vocab_size=300"):
    model_dir_lib.check_data(str(tmp_path), DATA)


def test_every_differing_field_is_named(tmp_path):
  model_dir_lib.check_data(str(tmp_path), DATA)
  (tmp_path / "spm.en.model").write_bytes(b"trained by the first run")
  swapped = dataclasses.replace(DATA, src_lang="de", tgt_lang="en")
  with pytest.raises(model_dir_lib.ModelDirError,
                     match=r"created with src_lang='en', tgt_lang='de'; the settings now give "
                           r"src_lang='de', tgt_lang='en' \(the vocabulary\)"):
    model_dir_lib.check_data(str(tmp_path), swapped)


def test_a_config_of_an_earlier_release_still_loads_and_resumes(tmp_path):
  """config.json written when --skip_padding was --padding_aware_ffn, before
--position_encoding and --max_relative_position, and before the options of other toolkits'
models (--activation, ...)."""
  added = ("position_encoding", "max_relative_position", "activation", "projection_biases",
           "layer_norm_epsilon", "output_bias", "sinusoid_layout", "scale_embeddings")
  old = {("padding_aware_ffn" if key == "skip_padding" else key): value
         for key, value in dataclasses.asdict(MODEL).items() if key not in added}
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert model_dir_lib.read_config(str(tmp_path)) == MODEL
  model_dir_lib.check_config(str(tmp_path), MODEL)  # a rerun with the same flags goes on
  assert json.loads((tmp_path / "config.json").read_text()) == dataclasses.asdict(MODEL)


def test_data_of_an_earlier_release_had_no_byte_fallback(tmp_path):
  """data.json written before --spm_byte_fallback: its subword models have none, so a rerun
  without the flag goes on and one with it is refused."""
  old = {"src_lang": "en", "tgt_lang": "de", "vocab_size": 100, "spm_model_type": "unigram",
         "shared_vocab": True}
  (tmp_path / "data.json").write_text(json.dumps(old))
  (tmp_path / "spm.joint.model").write_bytes(b"trained by the first run")
  assert model_dir_lib.read_data(str(tmp_path)) == {**old, "spm_byte_fallback": False}
  model_dir_lib.check_data(str(tmp_path), DATA)
  assert json.loads((tmp_path / "data.json").read_text()) == {**old, "spm_byte_fallback": False}
  with pytest.raises(model_dir_lib.ModelDirError, match="created with spm_byte_fallback=False"):
    model_dir_lib.check_data(str(tmp_path), dataclasses.replace(DATA, spm_byte_fallback=True))


@pytest.mark.parametrize("content", ["{", "[1, 2]", '{"d_model": 32, "colour": "red"}'])
def test_corrupt_or_foreign_config_is_one_line_error(tmp_path, content):
  (tmp_path / "config.json").write_text(content)
  with pytest.raises(model_dir_lib.ModelDirError, match=f"^{tmp_path}/config.json: "):
    model_dir_lib.read_config(str(tmp_path))


def test_write_json_replaces_the_file_whole(tmp_path, monkeypatch):
  path = str(tmp_path / "results.json")
  model_dir_lib.write_json(path, {"bleu": 1.0})

  def crash(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr(json, "dump", crash)
  with pytest.raises(OSError):
    model_dir_lib.write_json(path, {"bleu": 2.0})
  monkeypatch.undo()
  assert json.loads(open(path).read()) == {"bleu": 1.0}  # the old file, whole
  assert os.listdir(tmp_path) == ["results.json"]  # no temporary left behind


def test_model_dir_files_go_through_tensorflow_file_systems(tmp_path):
  folder = f"file://{tmp_path}/model"
  model_dir_lib.ensure_directory(folder)
  assert (tmp_path / "model").is_dir()
  model_dir_lib.check_config(folder, MODEL)
  model_dir_lib.check_config(folder, MODEL)  # read back through file://
  assert model_dir_lib.read_config(folder) == MODEL
  (tmp_path / "model" / "ckpt-10_temp").mkdir()
  (tmp_path / "model" / "data.json.tmp-123").write_text("{")
  checkpoints.remove_partial_saves(folder)
  assert os.listdir(tmp_path / "model") == ["config.json"]
