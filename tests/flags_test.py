"""The flagfiles: each parses, composes a model preset, and finds its corpora where shipped."""

import glob
import os

import pytest
from absl import flags

from data_pipeline import corpora
from tf_transformer import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
MODEL_PRESETS = ("base", "big", "small", "tiny")
TASK_PRESETS = ("multi30k_en_de", "multi30k_de_en", "iwslt15_en_vi", "iwslt15_vi_en",
                "iwslt17_en_de", "ja_vi")


def parse(name, *args):
  flags.FLAGS.unparse_flags()
  cwd = os.getcwd()
  os.chdir(ROOT)  # flagfiles name each other relative to the repository root
  try:
    flags.FLAGS(["test", f"--flagfile=flags/{name}.cfg", *args])
  finally:
    os.chdir(cwd)
  return flags.FLAGS


def test_every_flagfile_is_covered():
  names = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(ROOT, "flags", "*.cfg"))}
  assert names == set(MODEL_PRESETS + TASK_PRESETS)


def test_base_is_the_paper_base_model():
  f = parse("base")
  assert (f.num_layers, f.d_model, f.num_heads, f.d_ff) == (6, 512, 8, 2048)
  assert (f.dropout, f.label_smoothing, f.warmup_steps) == (0.1, 0.1, 4000)
  assert 20000 <= f.batch_tokens <= 30000 and f.norm_position == "post"


def test_big_is_the_paper_big_model():
  f = parse("big")
  assert (f.num_layers, f.d_model, f.num_heads, f.d_ff, f.dropout) == (6, 1024, 16, 4096, 0.3)


def test_small_has_the_peer_benchmark_dims():
  f = parse("small")
  assert (f.num_layers, f.d_model, f.num_heads, f.d_ff, f.vocab_size) == (3, 256, 8, 1024, 8000)
  assert f.shared_vocab


@pytest.mark.parametrize("name", TASK_PRESETS)
def test_task_preset_composes_a_model_preset_and_builds_configs(name):
  with open(os.path.join(ROOT, "flags", f"{name}.cfg")) as f:
    lines = [line.strip() for line in f if line.strip()]
  comments = [line for line in lines if line.startswith("#")]
  settings = [line for line in lines if not line.startswith("#")]
  assert settings[0] in {f"--flagfile=flags/{m}.cfg" for m in MODEL_PRESETS}
  assert any("Expect" in line for line in comments)
  parse(name)
  data = config.data_config_from_flags()
  train = config.train_config_from_flags()
  model = config.model_config_from_flags(data.vocab_size, data.vocab_size)
  assert data.test_prefix and data.dev_prefix and train.model_dir
  assert model.d_model % model.num_heads == 0


@pytest.mark.parametrize("name, folder", [("multi30k_en_de", "multi30k"),
                                          ("multi30k_de_en", "multi30k"), ("ja_vi", "ja_vi")])
def test_shipped_corpora_are_found_and_valid(name, folder):
  data_dir = os.path.join(SHARED_DATA, folder)
  if not os.path.isdir(data_dir):
    pytest.skip(f"{data_dir} is absent")
  parse(name, f"--data_dir={data_dir}")
  c = config.data_config_from_flags()
  for prefix in (c.train_prefix, c.dev_prefix, c.test_prefix):
    paths = [corpora.find_corpus_file(data_dir, prefix, lang) for lang in (c.src_lang, c.tgt_lang)]
    scan = corpora.scan_parallel(*paths)
    assert scan.num_lines > 0 and not scan.bad_lines
