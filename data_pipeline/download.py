"""Downloads a parallel corpus and checks every file before keeping it.

Each file is fetched to a temporary name in the output folder, checked (a non-empty gzip file
with the expected number of lines) and only then renamed to its final name, so an interrupted
run never leaves a half file behind. Files that already exist and pass the check are skipped,
so re-running is cheap.

Usage:
  python -m data_pipeline.download multi30k --out data/multi30k [--base_url URL]
"""

import dataclasses
import gzip
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
import zlib
from typing import Mapping

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Output folder (default: data/<dataset>).")
flags.DEFINE_string("base_url", None, "Overrides the URL the dataset files are fetched from.")

_TIMEOUT_S = 30
_CHUNK_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class Dataset:
  """Where a corpus lives and what its files must look like.

  Attributes:
    base_url: URL of the folder holding the files.
    files: File name -> expected number of lines after gunzip.
  """
  base_url: str
  files: Mapping[str, int]


_MULTI30K_LINES = {"train": 29000, "val": 1014, "test_2016_flickr": 1000}

DATASETS: dict[str, Dataset] = {
    "multi30k": Dataset(
        base_url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw",
        files={f"{split}.{lang}.gz": lines
               for split, lines in _MULTI30K_LINES.items()
               for lang in ("en", "de", "fr", "cs")}),
}


class DownloadError(Exception):
  """A download or check failed; the message is one line meant for the user."""


def _progbar(target: int):
  """Returns a keras Progbar over `target` files."""
  # Importing keras loads TensorFlow, whose C++ code logs straight to fd 2; mute it so that a
  # failure later on is still a single line on stderr.
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(os.devnull, "w") as null:
      os.dup2(null.fileno(), 2)
    from keras.utils import Progbar  # pylint: disable=g-import-not-at-top
  finally:
    os.dup2(saved, 2)
    os.close(saved)
  return Progbar(target, unit_name="file", stateful_metrics=["MB"])


def _count_lines(path: str) -> int:
  """Returns the number of lines of gzip file `path`; raises if it is not one."""
  if os.path.getsize(path) == 0:
    raise gzip.BadGzipFile("empty file")
  with gzip.open(path, "rb") as f:
    return sum(1 for _ in f)


def _offline(url: str, err: Exception) -> DownloadError:
  if isinstance(err, urllib.error.HTTPError):
    reason = f"HTTP {err.code} {err.reason}"
  else:
    reason = str(getattr(err, "reason", err)) or type(err).__name__
  return DownloadError(
      f"cannot download {url} ({reason}). You are offline or the URL is wrong; to use a local "
      "copy of the corpus, pass --data_dir=DIR to training instead of downloading.")


def download(name: str, out_dir: str, base_url: str | None = None,
             progress: bool = True) -> list[str]:
  """Downloads and checks every file of dataset `name` into `out_dir`.

  Args:
    name: A key of `DATASETS`, e.g. "multi30k".
    out_dir: Output folder; created if missing.
    base_url: Overrides the dataset's base URL (e.g. a local mirror).
    progress: Whether to show a progress bar.

  Returns:
    The final paths of all the dataset's files, in registry order.

  Raises:
    DownloadError: unknown dataset, network failure, or a file failing the check.
  """
  if name not in DATASETS:
    raise DownloadError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
  spec = DATASETS[name]
  base = (base_url or spec.base_url).rstrip("/")
  os.makedirs(out_dir, exist_ok=True)
  bar, mb, paths = None, 0.0, []
  for i, (fname, lines) in enumerate(spec.files.items()):
    path, url = os.path.join(out_dir, fname), f"{base}/{fname}"
    paths.append(path)
    try:
      if _count_lines(path) == lines:
        if bar:
          bar.update(i + 1, [("MB", mb)])
        continue
    except (OSError, EOFError, zlib.error):
      pass  # Missing or bad: (re)download it.
    fd, tmp = tempfile.mkstemp(prefix=f".{fname}.", suffix=".part", dir=out_dir)
    try:
      with os.fdopen(fd, "wb") as f:
        try:
          resp = urllib.request.urlopen(url, timeout=_TIMEOUT_S)
        except (OSError, ValueError, http.client.HTTPException) as e:  # ValueError: bad URL.
          raise _offline(url, e) from None
        with resp:
          # Created lazily: importing keras takes seconds, which is wasted when offline.
          if progress and bar is None:
            bar = _progbar(len(spec.files))
          while chunk := _read(resp, url):
            f.write(chunk)
            mb += len(chunk) / 2**20
            if bar:
              bar.update(i, [("MB", mb)])
      try:
        got = _count_lines(tmp)
      except gzip.BadGzipFile as e:
        raise DownloadError(f"{url}: not a gzip file ({e})") from None
      except (EOFError, zlib.error) as e:
        raise DownloadError(f"{url}: corrupt or truncated gzip file ({e})") from None
      if got != lines:
        raise DownloadError(
            f"{path}: expected {lines} lines, got {got} (corrupt or truncated download)")
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
    if bar:
      bar.update(i + 1, [("MB", mb)])
  return paths


def _read(resp, url: str) -> bytes:
  try:
    return resp.read(_CHUNK_BYTES)
  except (OSError, http.client.HTTPException) as e:
    raise _offline(url, e) from None


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    print(f"error: usage: python -m data_pipeline.download {{{'|'.join(DATASETS)}}} --out DIR "
          "[--base_url URL]", file=sys.stderr)
    sys.exit(1)
  out = FLAGS.out or os.path.join("data", argv[1])
  try:
    paths = download(argv[1], out, base_url=FLAGS.base_url)
  except (DownloadError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"{len(paths)} files checked in {out}")


if __name__ == "__main__":
  app.run(main)
