"""What translate reads and writes: input lines, and the output lines of translations
(n-best in the Moses format, hard alignments) and of scores."""

import sys

from tf_transformer.config import FlagError
from tf_transformer.inference import align_texts, score_texts, translate_texts


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


def translation_lines(functions, texts: list[str], nbest: int = 1, print_alignment=False,
                      first_index: int = 0, **batching) -> list[str]:
  """The output of each text: its translation line(s), each ending in a newline.

  Args:
    functions: inference.InferenceFunctions.
    texts: sentences numbered from `first_index` (the n-best index).
    nbest: 1: the best translation; more: `index ||| translation ||| score` lines.
    print_alignment: the best translation + ` ||| ` + its `src-tgt` piece alignment.
    batching: batch_size, batch_tokens, count_tokens, progress (see translate_texts).
  """
  if print_alignment:
    outputs, alignments = align_texts(functions.align, texts, **batching)
    return [f"{output} ||| {' '.join(f'{s}-{t}' for s, t in pairs)}\n"
            for output, pairs in zip(outputs, alignments)]
  outputs, scores = translate_texts(functions.translate_nbest, texts, **batching)
  if nbest == 1:
    return [hypotheses[0] + "\n" for hypotheses in outputs]
  return ["".join(f"{index} ||| {hypothesis} ||| {score:.4f}\n"
                  for hypothesis, score in list(zip(hypotheses, row_scores))[:nbest])
          for index, (hypotheses, row_scores) in enumerate(zip(outputs, scores), first_index)]


def translate_stream(functions, lines, out, nbest: int = 1, print_alignment: bool = False):
  """Translates each of `lines` (an iterator) as soon as it comes and writes its answer to
  `out` at once: a terminal or a pipe that waits for each answer is served line by line."""
  for index, line in enumerate(lines):
    out.write(translation_lines(functions, [line], nbest, print_alignment, index)[0])
    out.flush()


def score_lines(score, sources: list[str], targets: list[str], **batching) -> list[str]:
  """`score ||| target` lines (score: see score_texts) of line-aligned sentences."""
  return [f"{value:.4f} ||| {target}\n"
          for value, target in zip(score_texts(score, sources, targets, **batching), targets)]
