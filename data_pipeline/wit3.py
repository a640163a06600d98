"""Turns members of WIT3 (IWSLT TED) archives into sentences, one per line.

A WIT3 .tgz holds, per language, a `train.tags.*` file (one sentence a line between metadata lines
such as `<url>`, `<talkid>` or `<description>`) and `*.xml` dev/test sets (one `<seg id="N">` per
sentence inside `<doc docid="D">`). Each format returns (key, sentence) pairs: the key says where
the sentence sits in the source, so that the two sides of a parallel set can be checked to line up.
"""

import html
import re
import tarfile
from typing import Callable, Mapping

from common.errors import UserError

Sentences = list[tuple[str, str]]

_DOC_OR_SEG = re.compile(
    r'<doc\b[^>]*?\bdocid="([^"]*)"|<seg\b[^>]*?\bid="\s*([^"]*?)\s*"[^>]*>(.*?)</seg\s*>', re.S)


class FormatError(UserError, ValueError):
  """An archive or member is not as expected; the message is one line."""


def read_member(archive_path: str, name: str) -> bytes:
  """Reads the regular-file member `name` of a .tgz in one streaming pass.

  Nothing is written to disk and no other member is read, so odd member paths (absolute, `..`)
  are harmless.

  Raises:
    FormatError: `name` is missing from the archive or is not a regular file.
    tarfile.TarError, OSError, EOFError, zlib.error: the file is not a readable .tgz.
  """
  with tarfile.open(archive_path, "r|gz") as tar:
    for info in tar:
      if info.name.removeprefix("./") == name and info.isfile():
        return tar.extractfile(info).read()
  raise FormatError(f"no regular file {name} in the archive")


def _clean(text: str) -> str:
  # A sentence must stay on one line: a line break inside it would shift every later line.
  return text.replace("\r", " ").replace("\n", " ").strip()


def tag_lines(text: str) -> Sentences:
  """The text lines of a `train.tags` file, keyed by line number; lines starting with `<` go."""
  lines = text.split("\n")
  if lines and not lines[-1]:
    lines.pop()  # The final line break ends the last line; it does not start a new one.
  return [(f"line {number}", line.strip())
          for number, line in enumerate(lines, 1) if not line.strip().startswith("<")]


def seg_lines(text: str) -> Sentences:
  """The `<seg>` texts of a WIT3 XML file in order, entities unescaped, keyed by doc and seg id."""
  sentences, doc = [], None
  for match in _DOC_OR_SEG.finditer(text):
    if match.group(1) is not None:
      doc = match.group(1)
    else:
      sentences.append((f"doc {doc} seg {match.group(2)}", _clean(html.unescape(match.group(3)))))
  return sentences


FORMATS: dict[str, Callable[[str], Sentences]] = {"tags": tag_lines, "xml": seg_lines}


def convert(data: bytes, fmt: str) -> Sentences:
  """Decodes UTF-8 member `data` and applies format `fmt`, a key of `FORMATS`."""
  try:
    text = data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise FormatError(f"not UTF-8 text (byte {e.start})") from None
  return FORMATS[fmt](text)


def check_aligned(sides: Mapping[str, Sentences]) -> None:
  """Raises FormatError unless all `sides` (file name -> sentences) have the same keys in order."""
  (first, sentences), *others = sides.items()
  for name, other in others:
    if len(other) != len(sentences):
      raise FormatError(f"{first} has {len(sentences)} lines but {name} has {len(other)}; "
                        "parallel files must be line-aligned")
    for number, ((key, _), (other_key, _)) in enumerate(zip(sentences, other), 1):
      if key != other_key:
        raise FormatError(f"{first} and {name} are not aligned: line {number} is {key} in one "
                          f"and {other_key} in the other")
