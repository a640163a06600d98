"""Tests for data_pipeline.corpora: finding, validating and reading parallel text files."""

import pytest

from data_pipeline import corpora
from data_pipeline.corpora import CorpusError
from tests import testutil


def _pair(tmp_path, source_lines, target_lines, gz=False):
  return testutil.write_corpus(tmp_path, "train", source_lines, target_lines, ("en", "de"), gz)


# ---------------------------------------------------------------- find_corpus_file


def test_find_corpus_file_plain(tmp_path):
  path = testutil.write_lines(tmp_path / "train.en", ["a"])
  assert corpora.find_corpus_file(str(tmp_path), "train", "en") == path


def test_find_corpus_file_gz(tmp_path):
  path = testutil.write_lines(tmp_path / "train.en.gz", ["a"])
  assert corpora.find_corpus_file(str(tmp_path), "train", "en") == path


def test_find_corpus_file_prefers_plain(tmp_path):
  path = testutil.write_lines(tmp_path / "train.en", ["a"])
  testutil.write_lines(tmp_path / "train.en.gz", ["b"])
  assert corpora.find_corpus_file(str(tmp_path), "train", "en") == path


def test_find_corpus_file_missing(tmp_path):
  d = str(tmp_path)
  testutil.write_lines(tmp_path / "train.de", ["a"])
  with pytest.raises(CorpusError) as e:
    corpora.find_corpus_file(d, "train", "en")
  assert str(e.value) == (f"{d}/train.en: no such file (nor {d}/train.en.gz); "
                          "check data_dir and the prefixes")


def test_find_corpus_file_ignores_directory(tmp_path):
  (tmp_path / "train.en").mkdir()
  with pytest.raises(CorpusError, match="no such file"):
    corpora.find_corpus_file(str(tmp_path), "train", "en")


# ---------------------------------------------------------------- scan_parallel


@pytest.mark.parametrize("gz", [False, True])
def test_scan_clean_corpus(tmp_path, gz):
  src, tgt = _pair(tmp_path, ["hello", "", "world", "x"], ["hallo", "a", "welt", "   "], gz)
  scan = corpora.scan_parallel(src, tgt)
  assert scan == corpora.CorpusScan(num_lines=4, empty_pairs=2, bad_lines=())


def test_scan_crlf_and_no_trailing_newline(tmp_path):
  src = testutil.write_lines(tmp_path / "a.en", ["one", "two"], newline="\r\n")
  tgt = str(tmp_path / "a.de")
  (tmp_path / "a.de").write_bytes(b"eins\nzwei")  # no final line break
  assert corpora.scan_parallel(src, tgt) == corpora.CorpusScan(2, 0, ())


@pytest.mark.parametrize("missing", ["source", "target"])
def test_scan_missing_file(tmp_path, missing):
  src, tgt = _pair(tmp_path, ["a"], ["b"])
  path = src if missing == "source" else tgt
  (tmp_path / path.rsplit("/", 1)[1]).unlink()
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value) == f"{path}: no such file"


def test_scan_target_longer(tmp_path):
  src, tgt = _pair(tmp_path, ["a", "b", "c"], ["a", "b", "c", "d", "e"])
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value) == (f"{src} has 3 lines but {tgt} has 5; "
                          "parallel files must be line-aligned")




def test_scan_source_longer(tmp_path):
  src, tgt = _pair(tmp_path, ["a", "b", "c", "d", "e"], ["a", "b", "c"])
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value) == (f"{src} has 5 lines but {tgt} has 3; "
                          "parallel files must be line-aligned")


def test_scan_one_source_line_empty_target(tmp_path):
  src, tgt = _pair(tmp_path, ["a"], [])
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value) == (f"{src} has 1 lines but {tgt} has 0; "
                          "parallel files must be line-aligned")


def test_scan_empty_source_nonempty_target(tmp_path):
  src, tgt = _pair(tmp_path, [], ["a", "b"])
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value) == (f"{src} has 0 lines but {tgt} has 2; "
                          "parallel files must be line-aligned")


@pytest.mark.parametrize("gz", [False, True])
def test_scan_empty_files(tmp_path, gz):
  src, tgt = _pair(tmp_path, [], [], gz)
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value) == f"{src}: file is empty"


@pytest.mark.parametrize("gz", [False, True])
def test_scan_bad_utf8_source(tmp_path, gz):
  src, tgt = _pair(tmp_path, ["ok", "ab\xffcd".encode("latin-1"), "ok"], ["gut", "x", "y"], gz)
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value) == (f"{src}:2: not valid UTF-8 (byte 0xff at column 3); "
                          "fix the file or pass on_bad_line=skip")


def test_scan_bad_utf8_target_column_after_multibyte(tmp_path):
  # "ü" is two bytes; the column counts bytes, so the bad 0xe9 (latin-1 "é") is column 4.
  src, tgt = _pair(tmp_path, ["a", "b", "c"], ["ok", "ok", "\xfc".encode() + b"x\xe9"])
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value) == (f"{tgt}:3: not valid UTF-8 (byte 0xe9 at column 4); "
                          "fix the file or pass on_bad_line=skip")


def test_scan_bad_utf8_first_column(tmp_path):
  src, tgt = _pair(tmp_path, [b"\x80abc"], ["x"])
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value) == (f"{src}:1: not valid UTF-8 (byte 0x80 at column 1); "
                          "fix the file or pass on_bad_line=skip")


def test_scan_skip_bad_lines(tmp_path):
  src, tgt = _pair(tmp_path, ["a", b"\xff", "c", "", "e", "f"],
                   ["A", "B", "C", "D", b"E\xc3", "  "])
  scan = corpora.scan_parallel(src, tgt, on_bad_line="skip")
  assert scan == corpora.CorpusScan(num_lines=6, empty_pairs=2, bad_lines=(1, 4))


def test_scan_skip_still_checks_counts(tmp_path):
  src, tgt = _pair(tmp_path, ["a", b"\xff"], ["A", "B", "C"])
  with pytest.raises(CorpusError, match="parallel files must be line-aligned"):
    corpora.scan_parallel(src, tgt, on_bad_line="skip")


def test_scan_corrupt_gz(tmp_path):
  src = str(tmp_path / "train.en.gz")
  (tmp_path / "train.en.gz").write_bytes(b"this is not gzip data\n")
  tgt = testutil.write_lines(tmp_path / "train.de", ["a"])
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  message = str(e.value)
  assert message.startswith(f"{src}: cannot read (")
  assert message.endswith(")") and "\n" not in message


def test_scan_truncated_gz(tmp_path):
  src = testutil.write_lines(tmp_path / "train.en.gz", [f"line {i}" for i in range(1000)])
  data = (tmp_path / "train.en.gz").read_bytes()
  (tmp_path / "train.en.gz").write_bytes(data[:len(data) // 2])
  tgt = testutil.write_lines(tmp_path / "train.de", [f"zeile {i}" for i in range(1000)])
  with pytest.raises(CorpusError) as e:
    corpora.scan_parallel(src, tgt)
  assert str(e.value).startswith(f"{src}: cannot read (")


def test_scan_gz_mixed_with_plain(tmp_path):
  src = testutil.write_lines(tmp_path / "train.en.gz", ["a", "b"])
  tgt = testutil.write_lines(tmp_path / "train.de", ["A", "B"])
  assert corpora.scan_parallel(src, tgt) == corpora.CorpusScan(2, 0, ())


# ---------------------------------------------------------------- read_parallel


@pytest.mark.parametrize("gz", [False, True])
def test_read_parallel_drops_empty_and_strips(tmp_path, gz):
  src, tgt = _pair(tmp_path, ["  hello ", "", "x", "world\t", "Grüße"],
                   ["hallo", "leer", "  ", " welt", "greetings"], gz)
  assert corpora.read_parallel(src, tgt) == [("hello", "hallo"), ("world", "welt"),
                                             ("Grüße", "greetings")]


def test_read_parallel_limit(tmp_path):
  src, tgt = _pair(tmp_path, ["a", "", "b", "c", "d"], ["A", "B", "", "C", "D"])
  assert corpora.read_parallel(src, tgt, limit=2) == [("a", "A"), ("c", "C")]
  assert corpora.read_parallel(src, tgt, limit=1) == [("a", "A")]
  assert corpora.read_parallel(src, tgt, limit=0) == [("a", "A"), ("c", "C"), ("d", "D")]
  assert corpora.read_parallel(src, tgt, limit=10) == [("a", "A"), ("c", "C"), ("d", "D")]


def test_read_parallel_skip_lines(tmp_path):
  src, tgt = _pair(tmp_path, ["a", b"\xff", "c", "d"], ["A", "B", "C", b"\xfe"])
  scan = corpora.scan_parallel(src, tgt, on_bad_line="skip")
  assert scan.bad_lines == (1, 3)
  assert corpora.read_parallel(src, tgt, skip_lines=scan.bad_lines) == [("a", "A"), ("c", "C")]
  assert corpora.read_parallel(src, tgt, limit=1, skip_lines=[0, 1, 3]) == [("c", "C")]


def test_read_parallel_bad_line_not_skipped_raises(tmp_path):
  src, tgt = _pair(tmp_path, ["a", "b"], ["A", b"B\xff"])
  with pytest.raises(CorpusError) as e:
    corpora.read_parallel(src, tgt)
  assert str(e.value) == (f"{tgt}:2: not valid UTF-8 (byte 0xff at column 2); "
                          "fix the file or pass on_bad_line=skip")


# ---------------------------------------------------------------- iterate_sentences


def test_iterate_sentences(tmp_path):
  src, tgt = _pair(tmp_path, [" a ", "", b"\xff", "d"], ["A", "B", "C", "  "], gz=False)
  gz_src = testutil.write_lines(tmp_path / "more.en.gz", ["x", "", "y"])
  assert list(corpora.iterate_sentences([src, tgt, gz_src], skip_lines=(2,))) == [
      "a", "d", "A", "B", "x"]


def test_iterate_sentences_skips_bad_lines_of_scan(tmp_path):
  src, tgt = _pair(tmp_path, ["a", b"b\xff", "c"], ["A", "B", b"\xfeC"])
  scan = corpora.scan_parallel(src, tgt, on_bad_line="skip")
  sentences = list(corpora.iterate_sentences([src, tgt], scan.bad_lines))
  assert sentences == ["a", "A"]
