"""pyproject.toml: a console command for every tool, the dependencies requirements.txt pins, and
a package that installs and runs outside the repository."""

import importlib
import re
import shutil
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import testutil

PROJECT = tomllib.loads((testutil.ROOT / "pyproject.toml").read_text())["project"]
TOOLS = sorted(path.stem for path in (testutil.ROOT / "tf_transformer" / "bin").glob("*.py")
               if path.stem not in ("__init__", "cli", "shared_flags", "stderr_filter",
                                    "translation_io"))


def _pins() -> dict:
  """{canonical name: pinned version} of requirements.txt."""
  pins = {}
  for line in (testutil.ROOT / "requirements.txt").read_text().splitlines():
    if line.strip() and not line.startswith("#"):
      requirement = Requirement(line)
      pins[canonicalize_name(requirement.name)] = str(requirement.specifier).removeprefix("==")
  return pins


def test_every_tool_has_a_console_command_running_its_main():
  scripts = PROJECT["scripts"]
  assert sorted(target.split(":")[0].rsplit(".", 1)[1] for target in scripts.values()) == TOOLS
  for command, target in scripts.items():
    module, function = target.split(":")
    assert command == "tft-" + module.rsplit(".", 1)[1].replace("_", "-")
    assert function == "run" and callable(getattr(importlib.import_module(module), function))


def test_dependencies_are_the_pinned_packages_and_admit_their_pins():
  pins = _pins()
  declared = [Requirement(text) for text in PROJECT["dependencies"]]
  tests_only = {canonicalize_name(Requirement(text).name)
                for text in PROJECT["optional-dependencies"]["test"]}
  assert sorted(canonicalize_name(r.name) for r in declared) == sorted(set(pins) - tests_only)
  for requirement in declared:
    assert requirement.specifier.contains(pins[canonicalize_name(requirement.name)]), requirement


def test_the_installed_package_runs_its_commands_outside_the_repository(tmp_path):
  source, target = tmp_path / "source", tmp_path / "site"
  # pip builds in the source folder (build/, *.egg-info): a copy keeps the repository clean
  shutil.copytree(testutil.ROOT, source, ignore=shutil.ignore_patterns(
      ".*", "__pycache__", "tests", "bench", "docs", "flags", "data", "models", "exports"))
  build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          "--target", str(target), str(source)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
  assert build.returncode == 0, build.stderr[-3000:]
  assert sorted(p.name for p in (target / "bin").iterdir()) == sorted(PROJECT["scripts"])
  assert not (target / "tests").exists() and not (target / "bench").exists()
  env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target)}
  translate = subprocess.run([sys.executable, str(target / "bin" / "tft-translate"),
                              "--model_dir=/nonexistent"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
  assert translate.stderr == "error: /nonexistent: no such directory\n"
  helpshort = subprocess.run([sys.executable, str(target / "bin" / "tft-split-corpus"),
                              "--helpshort"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
  shown = set(re.findall(r"^  --(?:\[no\])?(\w+):", helpshort.stdout, re.M))
  assert {"src", "dev_size", "extra_src", "src_lang"} <= shown, helpshort.stdout[:2000]
