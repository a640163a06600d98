"""Writing a file or a folder so that a reader, or a run killed half-way, sees the old one or
the new one, never part of one.

The block writes a temporary sibling `<path>.tmp-<random>`, which is renamed to `path` when the
block ends without an error and deleted when it raises. Local paths go through `os` (the
download tool starts without TensorFlow); a path with a scheme (gs://, file://, ...) through
`tf.io.gfile`.
"""

import contextlib
import errno
import os
import shutil
import uuid

TEMPORARY_MARK = ".tmp-"  # in every temporary sibling's name: a sweep finds them by it


def _gfile():
  import tensorflow as tf  # only paths with a scheme need it
  return tf.io.gfile


def _is_remote(path: str) -> bool:
  return "://" in path


def temporary_sibling(path: str) -> str:
  """A fresh name beside `path`: `<path>.tmp-<12 hex digits>`."""
  return f"{path.rstrip('/')}{TEMPORARY_MARK}{uuid.uuid4().hex[:12]}"


def remove(path: str):
  """Deletes the file or folder `path` if it exists."""
  if _is_remote(path):
    gfile = _gfile()
    if gfile.exists(path):
      (gfile.rmtree if gfile.isdir(path) else gfile.remove)(path)
  elif os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  elif os.path.lexists(path):
    os.remove(path)


def _exists_error(path: str) -> FileExistsError:
  return FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)


def _publish(temporary: str, path: str, overwrite: bool):
  """Renames `temporary` (a file or a folder) to `path`. Without `overwrite` an existing
  `path` is a FileExistsError and is left as it is; with it, an old folder is replaced."""
  if _is_remote(path):
    gfile = _gfile()
    if gfile.exists(path):
      if not overwrite:
        raise _exists_error(path)
      if gfile.isdir(path):
        gfile.rmtree(path)
    gfile.rename(temporary, path, overwrite=overwrite)
  elif not overwrite:
    if os.path.isdir(temporary):
      if os.path.lexists(path):
        raise _exists_error(path)
      os.rename(temporary, path)
    else:
      os.link(temporary, path)  # unlike a rename, fails when `path` exists
      os.remove(temporary)
  elif os.path.isdir(path) and not os.path.islink(path):
    previous = temporary_sibling(path)  # the old folder stays whole until the new one is in
    os.rename(path, previous)
    os.rename(temporary, path)
    shutil.rmtree(previous, ignore_errors=True)
  else:
    os.replace(temporary, path)


@contextlib.contextmanager
def atomic_path(path: str, overwrite: bool = True):
  """Yields a temporary name beside `path` for the block to create, as a file or a folder; it
  becomes `path` when the block ends without an error.

  Args:
    path: the final file or folder.
    overwrite: replace an existing `path`; False: an existing `path` is a FileExistsError.
  """
  path = path.rstrip("/")
  temporary = temporary_sibling(path)
  try:
    yield temporary
    _publish(temporary, path, overwrite)
  finally:
    remove(temporary)


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w", overwrite: bool = True):
  """Opens a temporary file beside `path` for writing; it becomes `path` when the block ends
  without an error.

  It is opened before the block runs, so an unwritable path fails at once, with the name the
  user gave. Text is UTF-8 with "\\n" line ends.

  Args:
    path: the final file.
    mode: "w" (text) or "wb".
    overwrite: replace an existing `path`; False: an existing `path` is a FileExistsError.
  """
  with atomic_path(path, overwrite) as temporary:
    try:
      if _is_remote(path):
        f = _gfile().GFile(temporary, mode)
      elif "b" in mode:
        f = open(temporary, mode)
      else:
        f = open(temporary, mode, encoding="utf-8", newline="\n")
    except OSError as e:
      raise OSError(e.errno, e.strerror, path) from None
    with f:
      yield f
