"""Tests for data_pipeline.wit3 on small synthetic WIT3 members."""

import tarfile

import pytest

from data_pipeline import wit3
from tests import testutil

TAGS = (
    "<url>http://www.ted.com/talks/a</url>\n"
    "  <keywords>talks, a</keywords>\n"
    "<speaker>A B</speaker>\n"
    "<talkid>1</talkid>\n"
    "<title>A: t</title>\n"
    "<description>TED Talk Subtitles and Transcript: d</description>\n"
    "  First sentence.  \r\n"
    "\n"
    "AT&T < 3 & <b>\n"
    "<reviewer href=\"http://x\">R</reviewer>\n"
    "<translator href=\"http://y\">T</translator>\n"
    "</doc>\n"
    "Last, no line break")

XML = """<?xml version="1.0" encoding="UTF-8"?>
<mteval>
<srcset setid="iwslt2017-dev2010" srclang="german">
<doc docid="535" genre="lectures">
<url>http://www.ted.com/talks/a</url>
<talkid>535</talkid>
<seg id="1">  Tom &amp; Jerry sagen &quot;hallo&quot; &lt;3  </seg>
<seg id="2">zwei
 Zeilen</seg>
</doc>
<doc docid="7" genre="lectures">
<seg id="1">&#228;&apos;</seg>
</doc>
</srcset>
</mteval>
"""


def test_tag_lines_drops_tags_and_keeps_text_stripped():
  assert wit3.tag_lines(TAGS) == [
      ("line 7", "First sentence."), ("line 8", ""), ("line 9", "AT&T < 3 & <b>"),
      ("line 13", "Last, no line break")]


def test_tag_lines_final_line_break_adds_no_line():
  assert wit3.tag_lines("a\nb\n") == [("line 1", "a"), ("line 2", "b")]
  assert wit3.tag_lines("") == []


def test_seg_lines_unescapes_and_keys_by_doc_and_seg():
  assert wit3.convert(XML.encode(), "xml") == [
      ("doc 535 seg 1", 'Tom & Jerry sagen "hallo" <3'),
      ("doc 535 seg 2", "zwei  Zeilen"),  # A sentence never spans lines.
      ("doc 7 seg 1", "ä'")]


def test_convert_rejects_non_utf8():
  with pytest.raises(wit3.FormatError, match=r"not UTF-8 text \(byte 1\)"):
    wit3.convert(b"a\xff\n", "tags")


def test_read_member_reads_only_the_named_member(tmp_path):
  archive = tmp_path / "a.tgz"
  testutil.write_tgz(archive, {"../evil": b"x", "/abs": b"y", "de-en/README": b"r",
                               "./de-en/a.xml": b"a"})
  assert wit3.read_member(archive, "de-en/a.xml") == b"a"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tgz"]
  with pytest.raises(wit3.FormatError, match="no regular file de-en/b.xml in the archive"):
    wit3.read_member(archive, "de-en/b.xml")


def test_read_member_rejects_non_archive(tmp_path):
  (tmp_path / "a.tgz").write_bytes(b"<html>404</html>")
  with pytest.raises(tarfile.TarError):
    wit3.read_member(tmp_path / "a.tgz", "x")


def test_check_aligned():
  wit3.check_aligned({"a.de": [("k1", "x"), ("k2", "y")], "a.en": [("k1", "X"), ("k2", "Y")]})
  with pytest.raises(wit3.FormatError, match="^a.de has 2 lines but a.en has 1; "):
    wit3.check_aligned({"a.de": [("k1", "x"), ("k2", "y")], "a.en": [("k1", "X")]})
  with pytest.raises(wit3.FormatError, match=(
      "^a.de and a.en are not aligned: line 2 is k2 in one and k3 in the other$")):
    wit3.check_aligned({"a.de": [("k1", "x"), ("k2", "y")], "a.en": [("k1", "X"), ("k3", "Y")]})
