"""Tests for data_pipeline.public_corpora against loopback HTTP servers (no internet access)."""

import contextlib
import dataclasses
import functools
import gzip
import html
import http.server
import os
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from common import files
from data_pipeline import public_corpora
from tests import testutil

SHARED_MULTI30K = testutil.SHARED_DATA / "multi30k"
SHARED_IWSLT15 = testutil.SHARED_DATA / "iwslt15_en_vi"
SHARED_IWSLT17 = testutil.SHARED_DATA / "iwslt17_en_de"
MULTI30K_FILES = public_corpora.DATASETS["multi30k"].files


class _QuietHandler(http.server.SimpleHTTPRequestHandler):

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    pass


@contextlib.contextmanager
def _serve(directory):
  """Serves `directory` on 127.0.0.1 and yields its base URL."""
  handler = functools.partial(_QuietHandler, directory=str(directory))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()
    thread.join()


def _dead_url():
  """Returns a loopback URL whose port has nothing listening."""
  return f"http://127.0.0.1:{testutil.free_port()}"


def _gunzipped_lines(path):
  with gzip.open(path, "rb") as f:
    return sum(1 for _ in f)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
  # A proxy from the environment would intercept the loopback requests.
  for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("no_proxy", "127.0.0.1")


@pytest.fixture(scope="module")
def multi30k_dir(tmp_path_factory):
  testutil.shared_data(SHARED_MULTI30K.name)
  out = tmp_path_factory.mktemp("multi30k")
  with _serve(SHARED_MULTI30K) as url:
    paths = public_corpora.download("multi30k", out, base_url=url, progress=False)
  assert paths == [str(out / name) for name in MULTI30K_FILES]
  return out


def test_downloads_all_files(multi30k_dir):
  assert len(MULTI30K_FILES) == 12
  assert sorted(os.listdir(multi30k_dir)) == sorted(MULTI30K_FILES)  # No temp files left.
  for name, lines in MULTI30K_FILES.items():
    path = multi30k_dir / name
    assert _gunzipped_lines(path) == lines, name
    assert path.read_bytes() == (SHARED_MULTI30K / name).read_bytes(), name


def test_rerun_is_idempotent(multi30k_dir):
  before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in multi30k_dir.iterdir()}
  # Nothing is fetched again: the run succeeds with no server at all.
  paths = public_corpora.download("multi30k", multi30k_dir, base_url=_dead_url(), progress=False)
  assert paths == [str(multi30k_dir / name) for name in MULTI30K_FILES]
  after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in multi30k_dir.iterdir()}
  assert after == before


def test_truncated_file_is_rejected(tmp_path):
  served = tmp_path / "served"
  served.mkdir()
  for name, lines in MULTI30K_FILES.items():
    n = 3 if name == "train.en.gz" else lines
    (served / name).write_bytes(gzip.compress(b"a caption\n" * n))
  out = tmp_path / "out"
  with _serve(served) as url, pytest.raises(public_corpora.DownloadError) as exc:
    public_corpora.download("multi30k", out, base_url=url, progress=False)
  path = os.path.join(out, "train.en.gz")
  assert str(exc.value) == (
      f"{path}: expected 29000 lines, got 3 (corrupt or truncated download)")
  assert not os.path.exists(path)
  assert not [f for f in os.listdir(out) if files.TEMPORARY_MARK in f]


def test_not_gzip_is_rejected(tmp_path):
  served = tmp_path / "served"
  served.mkdir()
  for name in MULTI30K_FILES:
    (served / name).write_bytes(b"<html>not found</html>\n")
  with _serve(served) as url, pytest.raises(public_corpora.DownloadError, match="not a gzip file"):
    public_corpora.download("multi30k", tmp_path / "out", base_url=url, progress=False)


def test_unreachable_server_names_data_dir(tmp_path):
  with pytest.raises(public_corpora.DownloadError) as exc:
    public_corpora.download("multi30k", tmp_path, base_url=_dead_url(), progress=False)
  assert "give training its data_dir=DIR" in str(exc.value)
  assert "give training its --data_dir=DIR" in exc.value.as_flags()
  assert str(exc.value).startswith("cannot download http://127.0.0.1:")


def test_unknown_dataset():
  with pytest.raises(public_corpora.DownloadError, match="known: multi30k"):
    public_corpora.download("nope", "unused", progress=False)


def _with_counts(monkeypatch, name, counts):
  """Replaces some expected line counts of dataset `name` for this test (small synthetic data)."""
  spec = public_corpora.DATASETS[name]
  monkeypatch.setitem(public_corpora.DATASETS, name,
                      dataclasses.replace(spec, files={**spec.files, **counts}))


def _listing(directory):
  return sorted(p.name for p in Path(directory).iterdir())


# IWSLT'15 En-Vi (Stanford): plain text files, stored as they come.

def _iwslt15_served(directory):
  """Writes synthetic plain files, the train ones without a final line break; returns counts."""
  directory.mkdir()
  counts = {}
  for name in public_corpora.DATASETS["iwslt15_en_vi"].files:
    n = 4 if name.startswith("train") else 2
    text = "\n".join(f"{name} sentence {i} &apos;" for i in range(n))
    (directory / name).write_text(text if name.startswith("train") else text + "\n")
    counts[name] = n
  return counts


def test_iwslt15_plain_files(tmp_path, monkeypatch):
  counts = _iwslt15_served(tmp_path / "served")
  _with_counts(monkeypatch, "iwslt15_en_vi", counts)
  out = tmp_path / "out"
  with _serve(tmp_path / "served") as url:
    paths = public_corpora.download("iwslt15_en_vi", out, base_url=url, progress=False)
  assert paths == [str(out / name) for name in counts]
  assert _listing(out) == sorted(counts)
  for name in counts:
    assert (out / name).read_bytes() == (tmp_path / "served" / name).read_bytes(), name
  # A last line without a line break counts, both at download and on the rerun's check.
  before = {name: (out / name).stat().st_mtime_ns for name in counts}
  public_corpora.download("iwslt15_en_vi", out, base_url=_dead_url(), progress=False)
  assert {name: (out / name).stat().st_mtime_ns for name in counts} == before


def test_iwslt15_wrong_line_count_is_rejected(tmp_path, monkeypatch):
  counts = _iwslt15_served(tmp_path / "served")
  _with_counts(monkeypatch, "iwslt15_en_vi", {**counts, "tst2013.vi": 3})
  out = tmp_path / "out"
  with _serve(tmp_path / "served") as url, pytest.raises(public_corpora.DownloadError) as exc:
    public_corpora.download("iwslt15_en_vi", out, base_url=url, progress=False)
  assert str(exc.value) == (
      f"{out / 'tst2013.vi'}: expected 3 lines, got 2 (corrupt or truncated download)")
  assert "tst2013.vi" not in _listing(out)
  assert not [f for f in _listing(out) if files.TEMPORARY_MARK in f]


def test_iwslt15_real_dev_set(tmp_path, monkeypatch):
  testutil.shared_data(SHARED_IWSLT15.name)
  served = tmp_path / "served"
  counts = _iwslt15_served(served)
  for name in ("tst2012.en", "tst2012.vi"):  # Real files, with the registry's line counts.
    (served / name).write_bytes(gzip.decompress((SHARED_IWSLT15 / f"{name}.gz").read_bytes()))
    del counts[name]
  _with_counts(monkeypatch, "iwslt15_en_vi", counts)
  with _serve(served) as url:
    public_corpora.download("iwslt15_en_vi", tmp_path / "out", base_url=url, progress=False)
  for name in ("tst2012.en", "tst2012.vi"):
    assert (tmp_path / "out" / name).read_bytes() == (served / name).read_bytes()
    assert _gunzipped_lines(SHARED_IWSLT15 / f"{name}.gz") == 1553


# IWSLT'17 De-En (WIT3 archives): members converted to plain text.

IWSLT17 = public_corpora.DATASETS["iwslt17_de_en"]
TRAIN_ARCHIVE = "2017-01-trnted/texts/de/en/de-en.tgz"
TEST_ARCHIVES = {"de": "2017-01-ted-test/texts/de/en/de-en.tgz",
                 "en": "2017-01-ted-test/texts/en/de/en-de.tgz"}
SPLITS = sorted({name.rsplit(".", 1)[0] for name in IWSLT17.files})


def _train_tags(lang):
  return "".join(
      f"<url>http://www.ted.com/talks/talk_{talk}</url>\n"
      "<keywords>talks, science</keywords>\n"
      f"<speaker>Speaker {talk}</speaker>\n"
      f"<talkid>{talk}</talkid>\n"
      f"<title>Title {talk} ({lang})</title>\n"
      "<description>TED Talk Subtitles and Transcript: about &amp; so on</description>\n"
      f"  {lang} talk {talk} sentence one, AT&T.  \n"
      f"{lang} talk {talk} sentence two.\n"
      f"<reviewer href=\"http://www.ted.com/profiles/1\">R</reviewer>\n"
      f"<translator href=\"http://www.ted.com/profiles/2\">T</translator>\n"
      for talk in (1, 2)).encode()


def _xml(split, lang, segs, docid="1"):
  body = "".join(f'<seg id="{i}"> {text} </seg>\n' for i, text in enumerate(segs, 1))
  return (f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="{split}">\n'
          f'<doc docid="{docid}" genre="lectures">\n<url>http://x</url>\n<talkid>{docid}</talkid>\n'
          f"{body}</doc>\n</srcset>\n</mteval>\n").encode()


def _synthetic_iwslt17():
  """Archive path -> {member: bytes}, laid out like WIT3; and the output line counts."""
  archives = {TRAIN_ARCHIVE: {"de-en/README": b"readme", "../outside.txt": b"never read"},
              **{archive: {} for archive in TEST_ARCHIVES.values()}}
  for name, member in IWSLT17.members.items():
    split, lang = name.rsplit(".", 1)
    archives[member.archive][member.name] = _train_tags(lang) if split == "train" else _xml(
        split, lang, [f"{split} {lang} Tom &amp; Jerry &quot;{i}&quot; &lt;3" for i in range(3)])
  return archives, {name: 4 if name.startswith("train") else 3 for name in IWSLT17.files}


def _write_archives(directory, archives):
  for archive, members in archives.items():
    (directory / archive).parent.mkdir(parents=True, exist_ok=True)
    testutil.write_tgz(directory / archive, members)


def _run_iwslt17(tmp_path, archives):
  served, out = tmp_path / "served", tmp_path / "out"
  _write_archives(served, archives)
  with _serve(served) as url:
    return public_corpora.download("iwslt17_de_en", out, base_url=url, progress=False)


def _lines(path):
  return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def test_iwslt17_registry_layout():
  assert SPLITS == sorted(["train", "dev2010"] + [f"tst{y}" for y in range(2010, 2018)])
  assert set(IWSLT17.members) == set(IWSLT17.files)
  assert IWSLT17.members["tst2016.en"] == public_corpora.Member(
      TEST_ARCHIVES["en"], "en-de/IWSLT17.TED.tst2016.en-de.en.xml", "xml")
  assert IWSLT17.members["train.de"] == public_corpora.Member(
      TRAIN_ARCHIVE, "de-en/train.tags.de-en.de", "tags")
  for split in SPLITS:
    assert (f"{split}.de", f"{split}.en") in IWSLT17.aligned
    assert IWSLT17.files[f"{split}.de"] == IWSLT17.files[f"{split}.en"]


def test_iwslt17_synthetic(tmp_path, monkeypatch):
  archives, counts = _synthetic_iwslt17()
  _with_counts(monkeypatch, "iwslt17_de_en", counts)
  paths = _run_iwslt17(tmp_path, archives)
  out = tmp_path / "out"
  assert paths == [str(out / name) for name in IWSLT17.files]
  assert _listing(out) == sorted(IWSLT17.files)  # No archive or temp file left.
  assert not list(tmp_path.glob("**/outside.txt"))  # Odd member paths are never extracted.
  assert _lines(out / "train.de") == [
      "de talk 1 sentence one, AT&T.", "de talk 1 sentence two.",
      "de talk 2 sentence one, AT&T.", "de talk 2 sentence two."]
  for split in (s for s in SPLITS if s != "train"):
    for lang in ("de", "en"):
      assert _lines(out / f"{split}.{lang}") == [
          f'{split} {lang} Tom & Jerry "{i}" <3' for i in range(3)]
  # Rerun: nothing is fetched or rewritten.
  before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
  public_corpora.download("iwslt17_de_en", out, base_url=_dead_url(), progress=False)
  assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
  # A damaged file is remade with its partner, fetching only the archive it needs.
  (out / "tst2016.en").write_text("truncated\n")
  served = tmp_path / "served"
  os.remove(served / TRAIN_ARCHIVE)
  with _serve(served) as url:
    public_corpora.download("iwslt17_de_en", out, base_url=url, progress=False)
  assert _lines(out / "tst2016.en") == [f'tst2016 en Tom & Jerry "{i}" <3' for i in range(3)]
  assert _listing(out) == sorted(IWSLT17.files)


def test_iwslt17_count_differs_from_table(tmp_path, monkeypatch):
  archives, counts = _synthetic_iwslt17()
  _with_counts(monkeypatch, "iwslt17_de_en", {**counts, "train.de": 5, "train.en": 5})
  with pytest.raises(public_corpora.DownloadError) as exc:
    _run_iwslt17(tmp_path, archives)
  assert str(exc.value).startswith(
      f"{tmp_path / 'out' / 'train.de'}: expected 5 lines, got 4 (converted from http://")
  assert str(exc.value).endswith(f"/{TRAIN_ARCHIVE} member de-en/train.tags.de-en.de)")
  assert not [f for f in _listing(tmp_path / "out") if f.startswith(("train", "."))]


def test_iwslt17_sides_differ_in_length(tmp_path, monkeypatch):
  archives, counts = _synthetic_iwslt17()
  _with_counts(monkeypatch, "iwslt17_de_en", counts)
  archives[TRAIN_ARCHIVE]["de-en/train.tags.de-en.en"] += b"one more\n"
  with pytest.raises(public_corpora.DownloadError) as exc:
    _run_iwslt17(tmp_path, archives)
  out = tmp_path / "out"
  assert str(exc.value) == (f"{out / 'train.de'} has 4 lines but {out / 'train.en'} has 5; "
                            "parallel files must be line-aligned")


def test_iwslt17_test_seg_ids_must_match(tmp_path, monkeypatch):
  archives, counts = _synthetic_iwslt17()
  _with_counts(monkeypatch, "iwslt17_de_en", counts)
  archives[TEST_ARCHIVES["en"]]["en-de/IWSLT17.TED.tst2017.en-de.en.xml"] = _xml(
      "tst2017", "en", ["a", "b", "c"], docid="9")
  with pytest.raises(public_corpora.DownloadError) as exc:
    _run_iwslt17(tmp_path, archives)
  out = tmp_path / "out"
  assert str(exc.value) == (f"{out / 'tst2017.de'} and {out / 'tst2017.en'} are not aligned: "
                            "line 1 is doc 1 seg 1 in one and doc 9 seg 1 in the other")
  # Earlier splits are kept; the failed one is written neither side; no temp file is left.
  assert _listing(out) == sorted(f for f in IWSLT17.files if not f.startswith("tst2017"))


def test_iwslt17_missing_member(tmp_path, monkeypatch):
  archives, counts = _synthetic_iwslt17()
  _with_counts(monkeypatch, "iwslt17_de_en", counts)
  del archives[TRAIN_ARCHIVE]["de-en/IWSLT17.TED.dev2010.de-en.en.xml"]
  with pytest.raises(public_corpora.DownloadError, match=(
      r"^http://127\.0\.0\.1:\d+/2017-01-trnted/texts/de/en/de-en\.tgz: no regular file "
      r"de-en/IWSLT17\.TED\.dev2010\.de-en\.en\.xml in the archive$")):
    _run_iwslt17(tmp_path, archives)


@pytest.mark.parametrize("content", [b"<html>not found</html>\n", b"truncate"])
def test_iwslt17_bad_archive(tmp_path, content):
  served = tmp_path / "served"
  archives, _ = _synthetic_iwslt17()
  _write_archives(served, archives)
  archive = served / TRAIN_ARCHIVE
  data = archive.read_bytes()
  archive.write_bytes(data[:100] if content == b"truncate" else content)
  with _serve(served) as url, pytest.raises(public_corpora.DownloadError) as exc:
    public_corpora.download("iwslt17_de_en", tmp_path / "out", base_url=url, progress=False)
  assert f"/{TRAIN_ARCHIVE}: not a readable .tgz archive (" in str(exc.value)
  assert "\n" not in str(exc.value)
  assert _listing(tmp_path / "out") == []


def _real_xml(name):
  return gzip.decompress((SHARED_IWSLT17 / "xml" / f"{name}.gz").read_bytes())


def _seg_texts(xml):
  """The <seg> texts of a WIT3 XML file, parsed independently of data_pipeline.wit3."""
  return [(seg.text or "").strip() for seg in ET.fromstring(xml).iter("seg")]


def test_iwslt17_real_dev_and_test_sets(tmp_path, monkeypatch):
  testutil.shared_data(SHARED_IWSLT17.name, "xml")
  archives, counts = _synthetic_iwslt17()
  real = {}
  for name, member in IWSLT17.members.items():
    real_name = member.name.split("/")[1]
    if (SHARED_IWSLT17 / "xml" / f"{real_name}.gz").is_file():
      real[name] = archives[member.archive][member.name] = _real_xml(real_name)
      del counts[name]  # The registry's own count must hold for the real files.
  assert sorted(real) == ["dev2010.de", "dev2010.en", "tst2016.de", "tst2016.en",
                          "tst2017.de", "tst2017.en"]
  _with_counts(monkeypatch, "iwslt17_de_en", counts)
  _run_iwslt17(tmp_path, archives)
  out = tmp_path / "out"
  for name, xml in real.items():
    lines = _lines(out / name)
    assert len(lines) == IWSLT17.files[name], name
    assert lines == _seg_texts(xml), name
  assert _lines(out / "dev2010.de")[0].startswith("Letztes Jahr habe ich diese beiden Folien")
  assert _lines(out / "tst2016.en")[0].startswith("We're at a tipping point in human history")
  # The Hugging Face export of dev2010 has the same sentences.
  for lang in ("de", "en"):
    hf_txt = gzip.decompress((SHARED_IWSLT17 / "hf_txt" / f"valid-{lang}.txt.gz").read_bytes())
    hf = [html.unescape(line.strip()) for line in hf_txt.decode("utf-8").split("\n")]
    assert _lines(out / f"dev2010.{lang}") == hf
