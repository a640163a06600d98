"""Tests of tf_transformer/runtime.py: the choice of precision for --mixed_precision=auto."""

import pytest
import tensorflow as tf

from tf_transformer import runtime
from tf_transformer.config import TrainConfig

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f {extra}
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu
"""


@pytest.mark.parametrize("extra,expected", [("avx512_bf16 avx512_vnni", True),
                                            ("amx_bf16 amx_tile", True),
                                            ("avx512_vnni", False)])
def test_cpu_flags_read_the_first_cpu(tmp_path, extra, expected):
  path = tmp_path / "cpuinfo"
  path.write_text(CPUINFO.format(extra=extra))
  flags = runtime.cpu_flags(str(path))
  assert {"fpu", "avx2", "avx512f"} <= flags
  assert bool(flags & {"avx512_bf16", "amx_bf16"}) == expected


def test_no_cpuinfo_means_no_flags(tmp_path):
  assert runtime.cpu_flags(str(tmp_path / "missing")) == set()


@pytest.mark.parametrize("flags,expected", [({"avx2", "avx512_bf16"}, "mixed_bfloat16"),
                                            ({"amx_bf16"}, "mixed_bfloat16"),
                                            ({"avx2", "avx512f"}, "float32"),
                                            (set(), "float32")])
def test_auto_is_bfloat16_only_on_cpus_with_bfloat16_units(monkeypatch, flags, expected):
  monkeypatch.setattr(runtime, "cpu_flags", lambda: flags)
  config = runtime.resolve_precision(TrainConfig(model_dir="", mixed_precision="auto"),
                                     tf.distribute.get_strategy())
  assert config.mixed_precision == expected


@pytest.mark.parametrize("precision", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_an_explicit_precision_is_kept(monkeypatch, precision):
  monkeypatch.setattr(runtime, "cpu_flags", lambda: {"avx512_bf16"})
  config = runtime.resolve_precision(TrainConfig(model_dir="", mixed_precision=precision),
                                     tf.distribute.get_strategy())
  assert config.mixed_precision == precision
