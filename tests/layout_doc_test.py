"""docs/layout.md is the tree: every path it names exists, and every module of the packages,
tools and benchmarks is named in it."""

import re

from tests import testutil

FOLDERS = ("common", "data_pipeline", "tf_transformer", "tf_transformer/layers",
           "tf_transformer/decoding", "tf_transformer/serving", "tf_transformer/training",
           "tf_transformer/bin", "export", "bench", "bench/kernels", "bench/studies",
           "bench/peers")


def _layout() -> str:
  return (testutil.ROOT / "docs" / "layout.md").read_text().split("```", 2)[1]


def test_every_path_the_layout_names_exists():
  parents = {}
  named = []
  for line in _layout().splitlines():
    match = re.match(r"^((?:  ){0,2})(\S+\.(?:py|toml)|\S+/)(?:\s|$)", line)  # depth 0 to 2
    if not match:
      continue
    depth, name = len(match.group(1)) // 2, match.group(2)
    parents[depth] = name
    named.append("".join(parents[d] if parents[d].endswith("/") else "" for d in range(depth))
                 + name)
  assert len(named) > 20, named
  missing = [path for path in named if not (testutil.ROOT / path).exists()]
  assert not missing, missing


def test_every_module_is_named_in_the_layout():
  words = set(re.findall(r"[A-Za-z_]\w*", _layout()))
  unnamed = [f"{folder}/{path.name}" for folder in FOLDERS
             for path in (testutil.ROOT / folder).glob("*.py")
             if path.stem != "__init__" and path.stem not in words]
  assert not unnamed, unnamed
