"""Lists of sentences through a model's batch functions: batches of similar length (counted
in sentences or tokens), outputs back in input order. What `TranslationModel` and the
evaluator translate, score and align with."""

import re

import numpy as np
import tensorflow as tf

from tf_transformer.decoding.lexical_constraints import ConstraintError


def count_words(texts: list[str], side: str = "source") -> list[int]:
  """The whitespace-separated words of each text + 1 (its </s>), either side: what a SavedModel
  allows to count without tokenizing (it keeps its subword models in-graph)."""
  del side  # both sides are counted alike
  return [len(text.split()) + 1 for text in texts]


def make_batches(lengths: list[int], batch_size: int | None = 64,
                 batch_tokens: int | None = None) -> list[list[int]]:
  """Groups row indices into batches of similar length, shortest rows first.

  Args:
    lengths: the length of each row (tokens with `batch_tokens`; any measure otherwise).
    batch_size: at most this many rows a batch (None: no limit).
    batch_tokens: at most this many tokens a batch counting padding, rows x the batch's
      longest row (None: no limit); a row longer than this makes a batch of its own.

  Returns:
    Lists of indices into `lengths`, each index once.
  """
  batches, batch = [], []
  for index in sorted(range(len(lengths)), key=lengths.__getitem__):  # stable: ties in order
    # sorted: the new row is the batch's longest
    full = ((batch_size is not None and len(batch) >= batch_size)
            or (batch_tokens is not None and (len(batch) + 1) * lengths[index] > batch_tokens))
    if batch and full:
      batches.append(batch)
      batch = []
    batch.append(index)
  return batches + [batch] if batch else batches


def _lengths(texts, side, batch_tokens, count_tokens) -> list[int]:
  """Tokens of each text when batches are counted in tokens, else characters (the sort key)."""
  if batch_tokens is None:
    return [len(text) for text in texts]
  return (count_tokens or count_words)(texts, side)


def _in_batches(fn, rows: list[int], lengths: list[int], total: int, batch_size, batch_tokens,
                progress):
  """Calls fn(batch) for batches (lists of values of `rows`) of similar `lengths` (one per row),
  and sets `progress` to total - len(rows) + the rows done after each."""
  done = total - len(rows)
  for batch in make_batches(lengths, batch_size, batch_tokens):
    fn([rows[i] for i in batch])
    done += len(batch)
    if progress is not None:
      progress.update(done)


def translate_texts(translate_nbest, texts: list[str], batch_size: int | None = 64, progress=None,
                    batch_tokens: int | None = None, count_tokens=None,
                    prefixes: list[str] | None = None, seeds: list[int] | None = None,
                    constraints: list[str] | None = None, on_cut=None):
  """Translates `texts` in batches of similar length, keeping their order.

  Args:
    translate_nbest: fn(string [B]) -> {"outputs": string [B, n], "scores": float32 [B, n]},
      e.g. `Translator.translate_nbest` or a loaded SavedModel's signature; with `prefixes`,
      fn(string [B], prefix string [B]) -> the same (`Translator.translate_prefix`); with
      `seeds` too, fn(string [B], [prefix string [B],] seed int64 [B]) -> the same; with
      `constraints`, fn(string [B], constraints string [B], [prefix string [B]]) -> the same
      (`Translator.translate_constrained`).
    texts: the sentences; blank ones come back as "" without being decoded.
    batch_size, batch_tokens: the limits of a batch (see `make_batches`).
    progress: optional progress bar (`.update(count done)`) over len(texts), such as
      data_pipeline.progress.ProgressBar.
    count_tokens: fn(texts, side) -> token counts for `batch_tokens` (default `count_words`).
    prefixes: optional target prefixes, one per text ("" forces nothing).
    seeds: optional sampling seeds, one per text.
    constraints: optional tab-separated phrases, one line per text (see
      `Translator.translate_constrained`).
    on_cut: optional fn(indices): called once, at the end, with the indices of the texts
      whose source or prefix was cut (the output `cut`), if any.

  Returns:
    (list of n-best output lists, list of n-best score lists), one entry per text.

  Raises:
    ConstraintError: a text's constraints cannot be met (its index and the problem).
  """
  outputs, scores = [[""]] * len(texts), [[0.0]] * len(texts)
  todo = [i for i, text in enumerate(texts) if text.strip()]

  def translate(rows):
    inputs = [tf.constant([texts[i] for i in rows])]
    if constraints is not None:
      inputs.append(tf.constant([constraints[i] for i in rows]))
    if prefixes is not None:
      inputs.append(tf.constant([prefixes[i] for i in rows]))
    if seeds is not None:
      inputs.append(tf.constant([seeds[i] for i in rows], tf.int64))
    try:
      result = translate_nbest(*inputs)
    except tf.errors.InvalidArgumentError as e:
      problem = re.search(r"constraints: (.*) in row\] \[(\d+)\]", e.message)
      if problem is None:
        raise
      raise ConstraintError(rows[int(problem.group(2))], problem.group(1)) from None
    for row, hypotheses, row_scores in zip(rows, result["outputs"].numpy(),
                                           np.asarray(result["scores"])):
      outputs[row] = [h.decode("utf-8") for h in hypotheses]
      scores[row] = [float(s) for s in row_scores]
    cut.extend(_cut_rows(rows, result))

  cut = []
  lengths = _lengths([texts[i] for i in todo], "source", batch_tokens, count_tokens)
  _in_batches(translate, todo, lengths, len(texts), batch_size, batch_tokens, progress)
  _report(cut, on_cut)
  return outputs, scores


def _cut_rows(rows: list[int], result: dict) -> list[int]:
  """The values of `rows` whose row of a signature's `result` is cut (none from an export
  older than the output)."""
  if "cut" not in result:
    return []
  return [row for row, cut in zip(rows, np.asarray(result["cut"])) if cut]


def _report(cut: list[int], on_cut):
  if cut and on_cut is not None:
    on_cut(sorted(cut))


def score_texts(score, sources: list[str], targets: list[str], batch_size: int | None = 64,
                progress=None, batch_tokens: int | None = None, count_tokens=None,
                on_cut=None) -> list[float]:
  """The model's log-probability of each target given its source, over the length penalty.

  Args:
    score: fn(source string [B], target string [B]) -> {"log_prob": float32 [B]}.
    sources, targets: line-aligned sentences; every pair is scored, blank ones too (a blank
      target is `</s>` alone).
    batch_size, batch_tokens, progress, count_tokens, on_cut: as in `translate_texts`; a
      pair's length is the longer of its sides, and it is cut when either is.

  Returns:
    One float per pair, in order.
  """
  results = [0.0] * len(sources)

  def run(rows):
    result = score(tf.constant([sources[i] for i in rows]),
                   tf.constant([targets[i] for i in rows]))
    for row, value in zip(rows, np.asarray(result["log_prob"])):
      results[row] = float(value)
    cut.extend(_cut_rows(rows, result))

  cut = []
  lengths = [max(pair) for pair in zip(_lengths(sources, "source", batch_tokens, count_tokens),
                                       _lengths(targets, "target", batch_tokens, count_tokens))]
  _in_batches(run, list(range(len(sources))), lengths, len(sources), batch_size, batch_tokens,
              progress)
  _report(cut, on_cut)
  return results


def hard_alignment(attention, source_tokens, target_tokens) -> list[tuple[int, int]]:
  """For each target piece, the source piece it attends to most.

  Args:
    attention: float [T, S], e.g. one row of the `align` signature's "attention".
    source_tokens, target_tokens: str [S] and [T], the pieces read and written ("</s>" and ""
      padding are left out on both sides).

  Returns:
    (source index, target index) pairs, 0-based piece positions, in target order; none when the
    source has no piece but </s>.
  """
  attention = np.asarray(attention)
  real_source = [i for i, piece in enumerate(source_tokens) if piece not in ("", "</s>")]
  if not real_source:
    return []
  return [(real_source[int(np.argmax(attention[t, real_source]))], t)
          for t, piece in enumerate(target_tokens) if piece not in ("", "</s>")]


def align_texts(align, texts: list[str], batch_size: int | None = 64, progress=None,
                batch_tokens: int | None = None, count_tokens=None, on_cut=None):
  """The best translation of each text with its hard alignment (see `hard_alignment`).

  Args:
    align: fn(string [B]) -> the dict of `Translator.align`.
    texts, batch_size, progress, batch_tokens, count_tokens, on_cut: as in `translate_texts`.

  Returns:
    (list of translations, list of lists of (source, target) piece index pairs), one entry per
    text; a blank text gets "" and no pair.
  """
  outputs, alignments = [""] * len(texts), [[]] * len(texts)
  todo = [i for i, text in enumerate(texts) if text.strip()]

  def run(rows):
    result = {name: value.numpy() for name, value in
              align(tf.constant([texts[i] for i in rows])).items()}
    for j, row in enumerate(rows):
      outputs[row] = result["outputs"][j].decode("utf-8")
      alignments[row] = hard_alignment(
          result["attention"][j], [p.decode("utf-8") for p in result["source_tokens"][j]],
          [p.decode("utf-8") for p in result["target_tokens"][j]])
    cut.extend(_cut_rows(rows, result))

  cut = []
  lengths = _lengths([texts[i] for i in todo], "source", batch_tokens, count_tokens)
  _in_batches(run, todo, lengths, len(texts), batch_size, batch_tokens, progress)
  _report(cut, on_cut)
  return outputs, alignments
