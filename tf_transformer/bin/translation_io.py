"""What translate reads and writes: input lines, and the output lines of translations
(n-best in the Moses format, hard alignments) and of scores."""

import sys

from tf_transformer.bin.cli import FlagError


def iter_lines(path: str | None):
  """Yields the lines of `path` (stdin when None) as they are read; a line that is not UTF-8
  is a FlagError naming the file and line."""
  try:
    stream = open(path, "rb") if path else sys.stdin.buffer
  except OSError as e:
    raise FlagError(f"{path}: cannot read ({e.strerror})") from None
  with stream:
    # readline, not a read-ahead: a pipe's line is answered before the next one arrives
    for number, line in enumerate(iter(stream.readline, b""), start=1):
      try:
        yield line.rstrip(b"\r\n").decode("utf-8")
      except UnicodeDecodeError:
        raise FlagError(f"{path or '<stdin>'}:{number}: not valid UTF-8") from None


def read_lines(path: str | None) -> list[str]:
  """The lines of `path` (stdin when None), or a FlagError naming the file and line."""
  return list(iter_lines(path))


def translation_lines(model, texts: list[str], nbest: int = 1, print_alignment=False,
                      first_index: int = 0, target_prefix: list[str] | None = None,
                      search: dict | None = None, constraints: list | None = None,
                      **batching) -> list[str]:
  """The output of each text: its translation line(s), each ending in a newline.

  Args:
    model: inference.TranslationModel.
    texts: sentences numbered from `first_index` (the n-best index).
    nbest: 1: the best translation; more: `index ||| translation ||| score` lines.
    print_alignment: the best translation + ` ||| ` + its `src-tgt` piece alignment.
    target_prefix: optional prefixes, one per text, that the translations start with.
    search: DecodeConfig fields for this call (strategy, seed: see TranslationModel.translate).
    constraints: optional lists of phrases, one per text (see TranslationModel.translate).
    batching: batch_size, batch_tokens, progress (see TranslationModel.translate).
  """
  search = search or {}
  if print_alignment:
    outputs, alignments = model.align(texts, first_index=first_index, **batching)
    return [f"{output} ||| {' '.join(f'{s}-{t}' for s, t in pairs)}\n"
            for output, pairs in zip(outputs, alignments)]
  translated = model.translate(texts, nbest=nbest, target_prefix=target_prefix,
                               constraints=constraints, first_index=first_index, **search,
                               **batching)
  if nbest == 1:
    return [output + "\n" for output in translated]
  return ["".join(f"{index} ||| {hypothesis.text} ||| {hypothesis.score:.4f}\n"
                  for hypothesis in hypotheses)
          for index, hypotheses in enumerate(translated, first_index)]


def constraint_phrases(line: str) -> list[str]:
  """The phrases of a --constraints line: tab-separated, none in an empty line."""
  return line.split("\t") if line else []


def translate_stream(model, lines, out, nbest: int = 1, print_alignment: bool = False,
                     prefixes=None, search: dict | None = None, constraints=None):
  """Translates each of `lines` (an iterator) as soon as it comes and writes its answer to
  `out` at once: a terminal or a pipe that waits for each answer is served line by line.
  `prefixes`, `constraints`: optional iterators of target prefixes and of --constraints lines,
  one per line; `search`: as in `translation_lines`."""
  for index, line in enumerate(lines):
    prefix = None if prefixes is None else [next(prefixes, None)]
    if prefix == [None]:
      raise FlagError(f"line {index + 1} of the input has no target prefix: the prefixes must "
                      "be line-aligned with the input")
    phrases = None if constraints is None else next(constraints, None)
    if constraints is not None and phrases is None:
      raise FlagError(f"line {index + 1} of the input has no constraints line: the constraints "
                      "must be line-aligned with the input")
    out.write(translation_lines(model, [line], nbest, print_alignment, index, prefix, search,
                                None if phrases is None else [constraint_phrases(phrases)])[0])
    out.flush()


def score_lines(model, sources: list[str], targets: list[str], **batching) -> list[str]:
  """`score ||| target` lines (see TranslationModel.score) of line-aligned sentences."""
  return [f"{value:.4f} ||| {target}\n"
          for value, target in zip(model.score(sources, targets, **batching), targets)]
