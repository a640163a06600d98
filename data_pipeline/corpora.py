"""Finding, validating and reading line-aligned parallel text files (plain or .gz)."""

import dataclasses
import gzip
import itertools
import os
import zlib
from typing import Iterator

from common.errors import UserError
from common.progress import ProgressBar


class CorpusError(UserError, ValueError):
  """A corpus problem, in one line that names the file (and line)."""


def find_corpus_file(data_dir: str, prefix: str, lang: str) -> str:
  """Returns `{data_dir}/{prefix}.{lang}`, or the same with `.gz`.

  Raises:
    CorpusError: neither exists.
  """
  base = os.path.join(data_dir, f"{prefix}.{lang}")
  for path in (base, base + ".gz"):
    if os.path.isfile(path):
      return path
  raise CorpusError(f"{base}: no such file (nor {base}.gz); check {{data_dir:name}} and the "
                    "prefixes", data_dir=None)


def _open_lines(path: str) -> Iterator[bytes]:
  """Yields the raw lines of a plain or gzipped file, without the line break."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      for line in f:
        yield line.rstrip(b"\r\n")
  except (OSError, EOFError, zlib.error) as e:
    raise CorpusError(f"{path}: cannot read ({e})") from None


def _decode(line: bytes, path: str, number: int) -> str:
  try:
    return line.decode("utf-8")
  except UnicodeDecodeError as e:
    raise CorpusError(
        f"{path}:{number}: not valid UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1}); "
        "fix the file or pass {on_bad_line}", on_bad_line="skip") from None


@dataclasses.dataclass(frozen=True)
class CorpusScan:
  """What a validation pass over a parallel corpus found.

  Attributes:
    num_lines: lines in each file.
    empty_pairs: pairs with an empty (or blank) side; the pipelines drop them.
    bad_lines: 0-based numbers of the pairs with a non-UTF-8 side (skipped).
  """
  num_lines: int
  empty_pairs: int
  bad_lines: tuple[int, ...]


def scan_parallel(source_path: str, target_path: str, on_bad_line: str = "error") -> CorpusScan:
  """Checks that two files are line-aligned, non-empty UTF-8 text, streaming.

  Args:
    source_path, target_path: plain or .gz text files, one sentence a line.
    on_bad_line: "error" raises at the first non-UTF-8 line; "skip" records it.

  Raises:
    CorpusError: a file is missing or empty, the line counts differ (both are given), or a line
      is not UTF-8 (file:line) with on_bad_line="error".
  """
  for path in (source_path, target_path):
    if not os.path.isfile(path):
      raise CorpusError(f"{path}: no such file")
  progress = ProgressBar(None, unit="line", label=f"checking {source_path}", delay_s=2.0)
  try:
    return _scan(source_path, target_path, on_bad_line, progress)
  finally:
    progress.close()


def _scan(source_path, target_path, on_bad_line, progress) -> CorpusScan:
  source_lines, target_lines = _open_lines(source_path), _open_lines(target_path)
  count, empty, bad = 0, 0, []
  for source, target in itertools.zip_longest(source_lines, target_lines):
    if source is None or target is None:
      # one file ended: count what is left of the other for the message
      rest = 1 + sum(1 for _ in (source_lines if target is None else target_lines))
      counts = (count + rest, count) if target is None else (count, count + rest)
      raise CorpusError(f"{source_path} has {counts[0]} lines but {target_path} has "
                        f"{counts[1]}; parallel files must be line-aligned")
    count += 1
    if count % 10_000 == 0:
      progress.update(count)
    try:
      texts = [_decode(source, source_path, count), _decode(target, target_path, count)]
    except CorpusError:
      if on_bad_line == "error":
        raise
      bad.append(count - 1)
      continue
    if not texts[0].strip() or not texts[1].strip():
      empty += 1
  progress.update(count)
  if count == 0:
    raise CorpusError(f"{source_path}: file is empty")
  return CorpusScan(num_lines=count, empty_pairs=empty, bad_lines=tuple(bad))


def iterate_parallel(source_path: str, target_path: str,
                     skip_lines=()) -> Iterator[tuple[str, str]]:
  """The non-empty (source, target) pairs in order, streamed, minus the 0-based `skip_lines`."""
  skip = set(skip_lines)
  for number, (source, target) in enumerate(zip(_open_lines(source_path),
                                                 _open_lines(target_path))):
    if number in skip:
      continue
    source = _decode(source, source_path, number + 1).strip()
    target = _decode(target, target_path, number + 1).strip()
    if source and target:
      yield source, target


def read_parallel(source_path: str, target_path: str, limit: int = 0,
                  skip_lines=()) -> list[tuple[str, str]]:
  """The first `limit` (0: all) pairs of `iterate_parallel`, as a list.

  For small sets (dev, test); training data streams through tf.data instead.
  """
  pairs = iterate_parallel(source_path, target_path, skip_lines)
  return list(itertools.islice(pairs, limit or None))


def iterate_sentences(paths, skip_lines=()) -> Iterator[str]:
  """Every non-empty line of each file in `paths` (for training a subword model)."""
  skip = set(skip_lines)
  for path in paths:
    for number, line in enumerate(_open_lines(path)):
      if number not in skip:
        text = line.decode("utf-8", errors="replace").strip()
        if text:
          yield text
