"""tf_transformer/config.py and the flagfiles: each config field is its flag; presets parse."""

import dataclasses
import glob
import os
import re

import pytest
from absl import flags

from data_pipeline import corpora
from tests import testutil
from tf_transformer import config
from tf_transformer.bin import shared_flags
from tf_transformer.bin.cli import FlagError

MODEL_PRESETS = ("base", "big", "small", "tiny")
TASK_PRESETS = ("multi30k_en_de", "multi30k_de_en", "multi30k_en_multi", "iwslt15_en_vi",
                "iwslt15_vi_en", "iwslt17_en_de", "ja_vi")


def test_every_flagfile_is_covered():
  names = {os.path.basename(p)[:-4]
           for p in glob.glob(os.path.join(testutil.ROOT, "flags", "*.cfg"))}
  assert names == set(MODEL_PRESETS + TASK_PRESETS)


def test_base_is_the_paper_base_model():
  f = testutil.parse_flags("base")
  assert (f.num_layers, f.d_model, f.num_heads, f.d_ff) == (6, 512, 8, 2048)
  assert (f.dropout_rate, f.label_smoothing, f.warmup_steps) == (0.1, 0.1, 4000)
  assert 20000 <= f.batch_tokens <= 30000 and f.norm_position == "post"


def test_big_is_the_paper_big_model():
  f = testutil.parse_flags("big")
  assert (f.num_layers, f.d_model, f.num_heads, f.d_ff, f.dropout_rate) == (6, 1024, 16, 4096, 0.3)


def test_small_has_the_peer_benchmark_dims():
  f = testutil.parse_flags("small")
  assert (f.num_layers, f.d_model, f.num_heads, f.d_ff, f.vocab_size) == (3, 256, 8, 1024, 8000)
  assert f.shared_vocab


@pytest.mark.parametrize("name", TASK_PRESETS)
def test_task_preset_composes_a_model_preset_and_builds_configs(name):
  with open(os.path.join(testutil.ROOT, "flags", f"{name}.cfg")) as f:
    lines = [line.strip() for line in f if line.strip()]
  comments = [line for line in lines if line.startswith("#")]
  settings = [line for line in lines if not line.startswith("#")]
  assert settings[0] in {f"--flagfile=flags/{m}.cfg" for m in MODEL_PRESETS}
  assert any("Expect" in line for line in comments)
  testutil.parse_flags(name)
  data = shared_flags.data_config_from_flags()
  train = shared_flags.train_config_from_flags()
  model = shared_flags.model_config_from_flags(data.vocab_size, data.vocab_size)
  assert data.test_prefix and data.dev_prefix and train.model_dir
  assert (model.d_model, model.dropout_rate) == (flags.FLAGS.d_model, flags.FLAGS.dropout_rate)


@pytest.mark.parametrize("name, folder", [("multi30k_en_de", "multi30k"),
                                          ("multi30k_de_en", "multi30k"),
                                          ("multi30k_en_multi", "multi30k")])
def test_shipped_corpora_are_found_and_valid(name, folder):
  data_dir = testutil.shared_data(folder)
  testutil.parse_flags(name, f"--data_dir={data_dir}")
  c = shared_flags.data_config_from_flags()
  for prefix in (c.train_prefix, c.dev_prefix, c.test_prefix):
    for tgt_lang in c.tgt_langs:
      paths = [corpora.find_corpus_file(data_dir, prefix, lang) for lang in (c.src_lang, tgt_lang)]
      scan = corpora.scan_parallel(*paths)
      assert scan.num_lines > 0 and not scan.bad_lines


def test_flag_errors_name_the_flag():
  with pytest.raises(FlagError, match="--data_dir is required"):
    testutil.parse_flags("tiny")
    shared_flags.data_config_from_flags()
  with pytest.raises(FlagError, match=r"--d_model \(60\) must be divisible by "
                                             r"--num_heads \(8\)"):
    testutil.parse_flags("tiny", "--d_model=60", "--num_heads=8")
    shared_flags.model_config_from_flags(100, 100)


@pytest.mark.parametrize("config_class", [config.DataConfig, config.ModelConfig,
                                          config.TrainConfig, config.DecodeConfig])
def test_every_config_field_is_the_flag_of_the_same_name(config_class):
  from_data = {"source_vocab_size", "target_vocab_size"}  # the vocabulary gives these
  # --max_length: a model cuts its inputs where its training cut the pairs
  from_other_flags = {"max_source_length"}
  names = {field.name for field in dataclasses.fields(config_class)} - from_data - from_other_flags
  assert names <= set(flags.FLAGS), names - set(flags.FLAGS)


def test_configs_take_the_flag_values_by_name():
  testutil.parse_flags("tiny", "--data_dir=/data", "--model_dir=/model", "--dropout_rate=0.25",
                       "--relu_dropout_rate=0.05", "--max_length=37", "--nbest=2",
                       "--learning_rate=3.5", "--noshared_vocab")
  model = shared_flags.model_config_from_flags(11, 12)
  assert (model.source_vocab_size, model.target_vocab_size) == (11, 12)
  assert (model.dropout_rate, model.relu_dropout_rate, model.shared_vocab) == (0.25, 0.05, False)
  assert shared_flags.decode_config_from_flags().max_source_length == 37
  assert shared_flags.decode_config_from_flags().nbest == 2
  assert shared_flags.data_config_from_flags().max_length == 37
  assert shared_flags.train_config_from_flags().learning_rate == 3.5


@pytest.mark.parametrize("config_class", [config.DataConfig, config.TrainConfig,
                                          config.DecodeConfig])
def test_configs_are_frozen(config_class):
  value = config_class(model_dir="m") if config_class is config.TrainConfig else config_class()
  with pytest.raises(dataclasses.FrozenInstanceError):
    value.seed = 5


def test_norm_position_choices_are_the_layers():
  from tf_transformer.layers.residual import NORM_POSITIONS
  assert flags.FLAGS["norm_position"].parser.enum_values == list(NORM_POSITIONS)


@pytest.mark.parametrize("name, bad, good", [
    ("learning_rate", ["-1", "0", "nan", "inf"], ["1e-9", "2"]),
    ("clip_norm", ["-0.1", "nan", "inf"], ["0", "5"]),
    ("alpha", ["-0.5", "nan", "inf"], ["0", "1.2"]),
    ("label_smoothing", ["-0.1", "1", "nan"], ["0", "0.99"]),
    ("ema_decay", ["-0.1", "1"], ["0", "0.999"]),
    ("dropout_rate", ["-0.1", "1"], ["0", "0.5"]),
    ("attention_dropout_rate", ["1.5", "1"], ["0"]),
    ("relu_dropout_rate", ["-1"], ["0.3"])])
def test_real_valued_flags_are_refused_outside_their_domain_when_parsed(name, bad, good):
  for value in bad:
    with pytest.raises(flags.IllegalFlagValueError, match=f"^flag --{name}=.*: must be "):
      testutil.parse_flags("tiny", f"--{name}={value}")
  for value in good:
    assert testutil.parse_flags("tiny", f"--{name}={value}")[name].value == float(value)


@pytest.mark.parametrize("config_class, fields, message", [
    (config.DecodeConfig, {"beam_size": 0}, "beam_size=0 must be an integer >= 1"),
    (config.DecodeConfig, {"alpha": float("inf")}, "alpha=inf must be a finite number >= 0"),
    (config.DecodeConfig, {"alpha": -0.5}, "alpha=-0.5 must be a finite number >= 0"),
    (config.DecodeConfig, {"nbest": 5, "beam_size": 4}, "nbest=5 must be at most beam_size=4"),
    (config.DecodeConfig, {"max_source_length": 0},
     "max_source_length=0 must be an integer >= 1"),
    (config.DecodeConfig, {"strategy": "nucleus"},
     "strategy='nucleus' must be one of beam, sample"),
    (config.DecodeConfig, {"sampling_topk": -1}, "sampling_topk=-1 must be an integer >= 0"),
    (config.DecodeConfig, {"sampling_topp": 0.0}, "sampling_topp=0.0 must be in (0, 1]"),
    (config.DecodeConfig, {"sampling_topp": 1.5}, "sampling_topp=1.5 must be in (0, 1]"),
    (config.DecodeConfig, {"sampling_temperature": -0.5},
     "sampling_temperature=-0.5 must be a finite number >= 0"),
    (config.DecodeConfig, {"min_decode_length": 9, "max_decode_length": 8},
     "min_decode_length=9 must be at most max_decode_length=8"),
    (config.ModelConfig, {"attention_dropout_rate": 1.0},
     "attention_dropout_rate=1.0 must be in [0, 1)"),
    (config.ModelConfig, {"d_model": 30, "num_heads": 4},
     "d_model=30 must be even and divisible by num_heads=4"),
    (config.ModelConfig, {"norm_position": "middle"}, "norm_position='middle' must be one of"),
    (config.ModelConfig, {"position_encoding": "relative"},
     "max_relative_position=0 must be >= 1 with position_encoding=relative and 0 with "
     "sinusoidal, not with relative"),
    (config.ModelConfig, {"max_relative_position": 16},
     "max_relative_position=16 must be >= 1 with position_encoding=relative"),
    (config.ModelConfig, {"position_encoding": "rotary"}, "position_encoding='rotary' must be"),
    (config.TrainConfig, {"seed": -1}, "seed=-1 must be an integer >= 0 and <= 4294967295"),
    (config.TrainConfig, {"learning_rate": float("nan")}, "learning_rate=nan must be a finite"),
    (config.TrainConfig, {"warmup_steps": 1.5}, "warmup_steps=1.5 must be an integer >= 1"),
    (config.DataConfig, {"vocab_size": 8}, "vocab_size=8 must be an integer >= 16"),
    (config.DataConfig, {"spm_model_type": "word"}, "spm_model_type='word' must be one of")])
def test_configs_built_in_python_check_their_domains(config_class, fields, message):
  """The domains hold wherever a config is built, not only behind the flags."""
  required = {config.ModelConfig: {"source_vocab_size": 10, "target_vocab_size": 10},
              config.TrainConfig: {"model_dir": "m"}}.get(config_class, {})
  with pytest.raises(config.ConfigError, match=re.escape(f"{config_class.__name__}: {message}")):
    config_class(**required, **fields)
  config_class(**required)  # the defaults are inside every domain


def test_every_flag_domain_is_its_config_fields():
  """The flags take their bounds and choices from config's tables, so a flag and its field
  cannot disagree."""
  # the vocabulary gives these; max_source_length is --max_length's
  flag_of = {"source_vocab_size": None, "target_vocab_size": None,
             "max_source_length": "max_length",
             # export_saved_model's --batching settings
             "max_batch_size": "batching_max_size", "num_batch_threads": "batching_threads",
             "batch_timeout_micros": "batching_timeout_micros",
             "max_enqueued_batches": "batching_max_enqueued"}
  from tf_transformer.bin import export_saved_model  # noqa: F401  (defines --precision)
  for name, (low, high) in config.INTEGER_RANGES.items():
    if flag_of.get(name, name) is None:
      continue
    parser = flags.FLAGS[flag_of.get(name, name)].parser
    assert (parser.lower_bound, parser.upper_bound) == (low, high), name
  for name, choices in config.CHOICES.items():
    assert flags.FLAGS[name].parser.enum_values == list(choices), name


_USERS_PROGRAM = """
import sys
from absl import app, flags
flags.DEFINE_integer("batch_size", 7, "the user's own")
flags.DEFINE_integer("seed", 3, "the user's own")

def main(argv):
  import tf_transformer
  model = tf_transformer.load(sys.argv[1], beam_size=2)
  translation, = model.translate(["aa bb cc"])
  assert isinstance(translation, str)
  print(flags.FLAGS.batch_size, flags.FLAGS.seed)
  print(" ".join(sorted(module for module in flags.FLAGS.flags_by_module_dict()
                        if module.split(".")[0] in ("tf_transformer", "data_pipeline", "export",
                                                    "common"))))
  print("alpha" in flags.FLAGS, "model_dir" in flags.FLAGS)

app.run(main, argv=[sys.argv[0], "--batch_size=5"])
"""


def test_a_users_absl_program_with_its_own_flags_loads_a_model(tiny_model_dir):
  """The library defines no flag: a user's absl program with its own --batch_size and --seed
  imports it, loads a model and translates, and its FLAGS hold only its own flags."""
  result = testutil.run_python(_USERS_PROGRAM, str(tiny_model_dir), fresh=True)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  assert lines[0] == "5 3"
  assert lines[1] == ""  # no module of the project defined a flag
  assert lines[2] == "False False"


def test_batching_config_sizes_default_to_powers_of_two_and_are_checked():
  assert config.BatchingConfig().allowed_batch_sizes == (1, 2, 4, 8, 16, 32)
  assert config.BatchingConfig(max_batch_size=24).allowed_batch_sizes == (1, 2, 4, 8, 16, 24)
  assert config.BatchingConfig(max_batch_size=1).allowed_batch_sizes == (1,)
  assert config.BatchingConfig(8, (2, 8)).allowed_batch_sizes == (2, 8)
  for sizes in [(8, 4), (1, 4), (0, 8), (2, 2, 8), (1.5, 8)]:
    with pytest.raises(config.ConfigError, match="allowed_batch_sizes"):
      config.BatchingConfig(8, sizes)
  with pytest.raises(config.ConfigError, match="num_batch_threads=0 must be an integer >= 1"):
    config.BatchingConfig(num_batch_threads=0)
