"""common/files.py: a file or folder is written whole or not at all, for os and gfile paths."""

import os

import pytest

from common import files


def _names(folder):
  return sorted(os.listdir(folder))


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_a_file_appears_whole_at_the_end_and_replaces_the_old_one(tmp_path, scheme):
  path = tmp_path / "out.txt"
  path.write_text("old\n")
  with files.atomic_file(f"{scheme}{path}") as f:
    f.write("new ünïcode\n")
    assert path.read_text() == "old\n"  # nothing visible before the block ends
    assert len(_names(tmp_path)) == 2 and files.TEMPORARY_MARK in _names(tmp_path)[1]
  assert path.read_text(encoding="utf-8") == "new ünïcode\n"
  assert _names(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_an_error_in_the_block_keeps_the_old_file_and_leaves_no_temporary(tmp_path, scheme):
  path = tmp_path / "out.txt"
  path.write_text("old\n")
  with pytest.raises(RuntimeError):
    with files.atomic_file(f"{scheme}{path}") as f:
      f.write("half")
      raise RuntimeError("killed half-way")
  assert path.read_text() == "old\n"
  assert _names(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_without_overwrite_an_existing_file_is_an_error_and_stays(tmp_path, scheme):
  path = tmp_path / "batching_parameters.txt"
  path.write_text("a user's edit\n")
  with pytest.raises(FileExistsError):
    with files.atomic_file(f"{scheme}{path}", overwrite=False) as f:
      f.write("ours\n")
  assert path.read_text() == "a user's edit\n"
  assert _names(tmp_path) == ["batching_parameters.txt"]
  with files.atomic_file(f"{scheme}{tmp_path / 'fresh.txt'}", overwrite=False) as f:
    f.write("ours\n")
  assert (tmp_path / "fresh.txt").read_text() == "ours\n"


def test_an_unwritable_path_fails_before_the_work_naming_the_users_path(tmp_path):
  path = tmp_path / "missing_folder" / "out.txt"
  ran = False
  with pytest.raises(FileNotFoundError) as error:
    with files.atomic_file(str(path)):
      ran = True
  assert not ran and error.value.filename == str(path)


def test_a_folder_replaces_the_old_one_only_when_complete(tmp_path):
  final = tmp_path / "model"
  final.mkdir()
  (final / "old.bin").write_text("old")
  with pytest.raises(RuntimeError):
    with files.atomic_path(str(final)) as temporary:
      os.makedirs(temporary)
      (tmp_path / os.path.basename(temporary) / "new.bin").write_text("half")
      raise RuntimeError("converter failed")
  assert _names(final) == ["old.bin"] and _names(tmp_path) == ["model"]
  with files.atomic_path(str(final) + "/") as temporary:
    os.makedirs(temporary)
    (tmp_path / os.path.basename(temporary) / "new.bin").write_text("new")
  assert _names(final) == ["new.bin"] and _names(tmp_path) == ["model"]


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_a_folder_without_overwrite_never_replaces_an_existing_version(tmp_path, scheme):
  version = tmp_path / "3"
  version.mkdir()
  (version / "saved_model.pb").write_text("served")
  with pytest.raises(FileExistsError):
    with files.atomic_path(f"{scheme}{version}", overwrite=False) as temporary:
      os.makedirs(temporary.removeprefix("file://"))
  assert _names(version) == ["saved_model.pb"] and _names(tmp_path) == ["3"]
