"""The public parallel corpora this project fetches, and their download with a check of every
file before it is kept (the tool: `python -m tf_transformer.bin.download`).

Datasets (each `{split}.{lang}` file is one sentence a line, line-aligned across languages):
  multi30k: Multi30k task 1 (en, de, fr, cs) from github.com/multi30k/dataset, gzipped as
    published; for non-commercial research use.
  iwslt15_en_vi: IWSLT'15 English-Vietnamese from the Stanford NMT release (Luong & Manning 2015,
    nlp.stanford.edu/projects/nmt), plain tokenized text as published: train, tst2012, tst2013.
  iwslt17_de_en: IWSLT 2017 TED German-English from the WIT3 archives (github.com/hlt-mt/WIT3),
    converted to plain text: train (the `train.tags` text lines), dev2010, tst2010 to tst2015, and
    the official tst2016 and tst2017 (the German source of de-en paired with the English source of
    en-de). Their `<seg>` doc and seg ids must match pairwise.
  The IWSLT data are TED talks, Copyright TED Conference LLC, CC BY-NC-ND 3.0.

Each file is fetched (or converted from its archive member) to a temporary name in the output
folder, checked (its expected number of lines; gzip files must also be valid gzip) and only then
renamed to its final name, so an interrupted run never leaves a half file behind. Files that already
exist and pass the check are skipped, so re-running is cheap.
"""

import contextlib
import dataclasses
import gzip
import http.client
import os
import tarfile
import urllib.error
import urllib.request
import zlib
from typing import Mapping

from common import files
from common.errors import UserError
from common.progress import ProgressBar
from data_pipeline import wit3

_TIMEOUT_S = 30
_CHUNK_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class Member:
  """The archive member an output file is converted from.

  Attributes:
    archive: Path of a .tgz relative to the dataset's base URL.
    name: Path of the member inside the archive.
    fmt: A key of `wit3.FORMATS`: how the member becomes one sentence a line.
  """
  archive: str
  name: str
  fmt: str


@dataclasses.dataclass(frozen=True)
class Dataset:
  """Where a corpus lives and what its files must look like.

  Attributes:
    base_url: URL of the folder holding the files or archives.
    files: Output file name -> expected number of lines (gunzipped if the name ends in .gz; a last
      line without a line break counts). A file not in `members` is `{base_url}/{name}` as it is.
    members: Output file name -> the archive member it is converted from.
    aligned: Groups of converted files that are the sides of one parallel set: they are made
      together, and the keys of their sentences (doc and seg ids, line numbers) must match.
  """
  base_url: str
  files: Mapping[str, int]
  members: Mapping[str, Member] = dataclasses.field(default_factory=dict)
  aligned: tuple[tuple[str, ...], ...] = ()


_MULTI30K_LINES = {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
_IWSLT15_LINES = {"train": 133317, "tst2012": 1553, "tst2013": 1268}
_IWSLT17_LINES = {"train": 206112, "dev2010": 888, "tst2010": 1568, "tst2011": 1138,
                  "tst2012": 1145, "tst2013": 1080, "tst2014": 1106, "tst2015": 1080,
                  "tst2016": 1133, "tst2017": 1138}
_IWSLT17_DEV_TEST = ["dev2010"] + [f"tst{year}" for year in range(2010, 2016)]
_WIT3_DE_EN = "2017-01-trnted/texts/de/en/de-en.tgz"
# The official test sets hold only the source side of each direction.
_WIT3_TEST = {"de": ("2017-01-ted-test/texts/de/en/de-en.tgz", "de-en"),
              "en": ("2017-01-ted-test/texts/en/de/en-de.tgz", "en-de")}

DATASETS: dict[str, Dataset] = {
    "multi30k": Dataset(
        base_url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw",
        files={f"{split}.{lang}.gz": lines
               for split, lines in _MULTI30K_LINES.items()
               for lang in ("en", "de", "fr", "cs")}),
    "iwslt15_en_vi": Dataset(
        base_url="https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi",
        files={f"{split}.{lang}": lines
               for split, lines in _IWSLT15_LINES.items() for lang in ("en", "vi")}),
    "iwslt17_de_en": Dataset(
        base_url="https://raw.githubusercontent.com/hlt-mt/WIT3/master/archive",
        files={f"{split}.{lang}": lines
               for split, lines in _IWSLT17_LINES.items() for lang in ("de", "en")},
        members={
            **{f"train.{lang}": Member(_WIT3_DE_EN, f"de-en/train.tags.de-en.{lang}", "tags")
               for lang in ("de", "en")},
            **{f"{split}.{lang}": Member(
                _WIT3_DE_EN, f"de-en/IWSLT17.TED.{split}.de-en.{lang}.xml", "xml")
               for split in _IWSLT17_DEV_TEST for lang in ("de", "en")},
            **{f"{split}.{lang}": Member(
                archive, f"{pair}/IWSLT17.TED.{split}.{pair}.{lang}.xml", "xml")
               for split in ("tst2016", "tst2017")
               for lang, (archive, pair) in _WIT3_TEST.items()}},
        aligned=tuple((f"{split}.de", f"{split}.en") for split in _IWSLT17_LINES)),
}


class DownloadError(UserError):
  """A download or check failed; the message is one line meant for the user."""


def _count_lines(path: str, gz: bool) -> int:
  """Returns the number of lines of `path`, gunzipped if `gz`; raises if it is not gzip then."""
  if gz and os.path.getsize(path) == 0:
    raise gzip.BadGzipFile("empty file")
  with (gzip.open if gz else open)(path, "rb") as f:
    return sum(1 for _ in f)  # Splits at b"\n" only, as training reads; a last partial line counts.


def _is_done(path: str, lines: int) -> bool:
  try:
    return _count_lines(path, path.endswith(".gz")) == lines
  except (OSError, EOFError, zlib.error):
    return False  # Missing or bad: (re)make it.


def _offline(url: str, err: Exception) -> DownloadError:
  if isinstance(err, urllib.error.HTTPError):
    reason = f"HTTP {err.code} {err.reason}"
  else:
    reason = str(getattr(err, "reason", err)) or type(err).__name__
  return DownloadError(
      f"cannot download {url} ({reason}). You are offline or the URL is wrong; to use a local "
      "copy of the corpus, give training its {data_dir} instead of downloading.", data_dir="DIR")


def _read(resp, url: str) -> bytes:
  try:
    return resp.read(_CHUNK_BYTES)
  except (OSError, http.client.HTTPException) as e:
    raise _offline(url, e) from None


class _Run:
  """One call of `download`: fetching with a progress bar, and the archives fetched so far."""

  def __init__(self, base: str, out_dir: str, total: int, progress: bool):
    self.base, self.out_dir, self.total, self.progress = base, out_dir, total, progress
    self.bar, self.mb, self.done = None, 0.0, 0
    self.archives: dict[str, str] = {}  # Path under base -> local temporary file.

  def show(self, newly_done: int = 0) -> None:
    self.done += newly_done
    if self.bar:
      self.bar.update(self.done, {"MB": round(self.mb, 1)})

  def fetch(self, rel: str, dest: str) -> str:
    """Writes `{base}/{rel}` to the file `dest`; returns the URL."""
    url = f"{self.base}/{rel}"
    try:
      resp = urllib.request.urlopen(url, timeout=_TIMEOUT_S)
    except (OSError, ValueError, http.client.HTTPException) as e:  # ValueError: bad URL.
      raise _offline(url, e) from None
    with resp, open(dest, "wb") as f:
      if self.progress and self.bar is None:
        self.bar = ProgressBar(self.total, unit="file", label="downloading")
      while chunk := _read(resp, url):
        f.write(chunk)
        self.mb += len(chunk) / 2**20
        self.show()
    return url

  def archive(self, rel: str) -> str:
    """The local copy of archive `{base}/{rel}`, fetched on first use."""
    if rel not in self.archives:
      # named before fetching, so close() removes it
      self.archives[rel] = files.temporary_sibling(
          os.path.join(self.out_dir, os.path.basename(rel)))
      self.fetch(rel, self.archives[rel])
    return self.archives[rel]

  def close(self) -> None:
    if self.bar:
      self.bar.close()
    for tmp in self.archives.values():
      if os.path.exists(tmp):
        os.remove(tmp)


def _fetch_as_is(run: _Run, fname: str, lines: int) -> None:
  path = os.path.join(run.out_dir, fname)
  with files.atomic_path(path) as tmp:
    url = run.fetch(fname, tmp)
    try:
      got = _count_lines(tmp, fname.endswith(".gz"))
    except gzip.BadGzipFile as e:
      raise DownloadError(f"{url}: not a gzip file ({e})") from None
    except (EOFError, zlib.error) as e:
      raise DownloadError(f"{url}: corrupt or truncated gzip file ({e})") from None
    if got != lines:
      raise DownloadError(
          f"{path}: expected {lines} lines, got {got} (corrupt or truncated download)")


def _convert(run: _Run, spec: Dataset, group: tuple[str, ...]) -> None:
  """Makes the aligned files `group` from their archive members, checked, all or none."""
  sides, sources = {}, {}
  for fname in group:
    member, path = spec.members[fname], os.path.join(run.out_dir, fname)
    local, url = run.archive(member.archive), f"{run.base}/{member.archive}"
    sources[path] = f"{url} member {member.name}"
    try:
      data = wit3.read_member(local, member.name)
    except wit3.FormatError as e:
      raise DownloadError(f"{url}: {e}") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
      raise DownloadError(f"{url}: not a readable .tgz archive ({e})") from None
    try:
      sides[path] = wit3.convert(data, member.fmt)
    except wit3.FormatError as e:
      raise DownloadError(f"{sources[path]}: {e}") from None
  try:
    wit3.check_aligned(sides)
  except wit3.FormatError as e:
    raise DownloadError(str(e)) from None
  for fname, (path, sentences) in zip(group, sides.items()):
    if len(sentences) != spec.files[fname]:
      raise DownloadError(f"{path}: expected {spec.files[fname]} lines, got {len(sentences)} "
                          f"(converted from {sources[path]})")
  with contextlib.ExitStack() as stack:  # every file complete before any is renamed
    for path, sentences in sides.items():
      stack.enter_context(files.atomic_file(path)).writelines(
          text + "\n" for _, text in sentences)


def download(name: str, out_dir: str, base_url: str | None = None,
             progress: bool = True) -> list[str]:
  """Downloads (and converts) and checks every file of dataset `name` into `out_dir`.

  Args:
    name: A key of `DATASETS`, e.g. "multi30k".
    out_dir: Output folder; created if missing.
    base_url: Overrides the dataset's base URL (e.g. a local mirror laid out the same way).
    progress: Whether to show a progress bar.

  Returns:
    The final paths of all the dataset's files, in registry order.

  Raises:
    DownloadError: unknown dataset, network failure, a bad archive, or a file failing the check.
  """
  if name not in DATASETS:
    raise DownloadError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
  spec = DATASETS[name]
  os.makedirs(out_dir, exist_ok=True)
  in_groups = {fname for group in spec.aligned for fname in group}
  groups = list(spec.aligned) + [(fname,) for fname in spec.files if fname not in in_groups]
  run = _Run((base_url or spec.base_url).rstrip("/"), out_dir, len(spec.files), progress)
  try:
    for group in groups:
      if not all(_is_done(os.path.join(out_dir, f), spec.files[f]) for f in group):
        if group[0] in spec.members:
          _convert(run, spec, group)
        else:
          _fetch_as_is(run, group[0], spec.files[group[0]])
      run.show(len(group))
  finally:
    run.close()
  return [os.path.join(out_dir, fname) for fname in spec.files]
