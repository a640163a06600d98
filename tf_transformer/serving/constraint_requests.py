"""Terminology constraints as a request sends them (lines of tab-separated target phrases),
checked in-graph for the whole request, then read into decoding.lexical_constraints.Constraints
a chunk of rows at a time.

A line holds tab-separated phrases of target text; one that starts with "!" must not appear;
"" holds none. A request whose constraints cannot be met fails with an InvalidArgumentError
that reads "constraints: <the problem> in row] [<its index>]", before batching, so that one
bad request fails no other.
"""

from typing import NamedTuple

import tensorflow as tf

from data_pipeline.token_ids import UNK_ID
from tf_transformer import decoding
from tf_transformer.decoding import lexical_constraints
from tf_transformer.serving.signatures import BYTES_PER_PIECE


def word_inside(tokenizer, vocab_size: int):
  """bool [vocab_size]: the subword pieces that start with a letter or a digit and no word
  boundary ("▁"), which go on with the word before them (lexical_constraints.Constraints)."""
  pieces = tokenizer.id_to_string(tf.range(vocab_size)).numpy()
  return [piece.decode("utf-8")[:1].isalnum() for piece in pieces]


def constraints_of(pieces: "ConstraintPieces", inside):
  """`constraint_pieces` of some rows -> their lexical_constraints.Constraints, as wide as the
  longest row's (padding costs every step of the search), with word_inside `inside`."""
  return lexical_constraints.from_phrases(pieces.positive, pieces.negative, inside)


def phrase_bytes(max_constraint_tokens: int) -> int:
  """The most bytes of a phrase: as many as max_constraint_tokens pieces can come from."""
  return BYTES_PER_PIECE * max_constraint_tokens


class ConstraintPieces(NamedTuple):
  """The phrases of constraint lines (`constraint_pieces`): `positive` and `negative`,
  int32 ragged [B, (phrases), (pieces)], the target pieces of those to include and of those to
  avoid; `empty` and `too_long`, bool ragged [B, (n)], the empty phrases and those of more
  bytes than max_constraint_tokens pieces; `too_many`, bool [B], lines of more than
  2 x max_constraint_tokens phrases (read up to there)."""
  positive: tf.RaggedTensor
  negative: tf.RaggedTensor
  empty: tf.RaggedTensor
  too_long: tf.RaggedTensor
  too_many: tf.Tensor


def constraint_pieces(tokenizer, lines, max_constraint_tokens: int) -> ConstraintPieces:
  """string [B] -> `ConstraintPieces` of each line's phrases, tokenized by the target's
  `tokenizer`.

  A line is read up to its first 2 x max_constraint_tokens phrases, each up to its first
  `phrase_bytes`: more is refused (`checked`), and the heads bound the memory of any line."""
  most = 2 * max_constraint_tokens
  # a line of more phrases is refused: its rest stays one string (a 1 MB line of tabs is not
  # a million strings)
  phrases = tf.strings.split(lines, "\t", maxsplit=most)  # -> [B, (n <= most + 1)]
  empty = tf.equal(tf.strings.length(phrases), 0) & (tf.strings.length(lines) > 0)[:, tf.newaxis]
  phrases = tf.ragged.boolean_mask(phrases, tf.strings.length(phrases) > 0)  # "" line: none
  too_many = phrases.row_lengths() > most
  phrases = phrases[:, :most]
  # bytes, not regular expressions: a phrase may be invalid UTF-8
  negative = tf.equal(tf.strings.substr(phrases, 0, 1), "!")
  start = tf.cast(negative.flat_values, tf.int32)
  size = phrase_bytes(max_constraint_tokens)
  texts = tf.strings.substr(phrases.flat_values, start, tf.fill(tf.shape(start), size))
  pieces = tokenizer.tokenize(texts)  # -> [all phrases, (p)]
  nested = tf.RaggedTensor.from_row_splits(pieces, phrases.row_splits)  # -> [B, (n), (p)]
  too_long = phrases.with_flat_values(tf.strings.length(phrases.flat_values) > size)
  return ConstraintPieces(tf.ragged.boolean_mask(nested, tf.logical_not(negative)),
                          tf.ragged.boolean_mask(nested, negative), empty, too_long, too_many)


def checks(pieces: ConstraintPieces, limits, prefix_ids, max_constraint_tokens: int):
  """Assertions that fail the request unless each row's constraints can be met: a list of ops
  to run before its search. They read the phrases' pieces alone (memory as the request's
  text), and the constraints are built a chunk of rows at a time after them (`constraints_of`),
  so that a request of any number of rows takes bounded memory.

  The problems: an empty phrase; more than 2 x max_constraint_tokens phrases; a phrase of
  more bytes than max_constraint_tokens pieces can hold (BYTES_PER_PIECE each); a phrase of
  no subword piece; a phrase to include with a character out of the target vocabulary (its
  output could not show it); more positive pieces (or negative phrases, or pieces of one)
  than max_constraint_tokens; positive pieces that do not fit the output's length limit after
  the prefix (a row with none to include is not checked: its prefix is cut at the limit).

  Args:
    pieces: `constraint_pieces` of the lines.
    limits: int32 [B], each row's output length limit (decoding.output_limits).
    prefix_ids: optional int32 [B, P], the rows' forced prefixes, PAD_ID-padded.
    max_constraint_tokens: the export's bound.
  """
  positive, negative = pieces.positive, pieces.negative
  size = max_constraint_tokens
  positive_count = tf.cast(tf.reduce_sum(positive.row_lengths(axis=2), axis=1), tf.int32)
  prefix_count = 0 if prefix_ids is None else decoding.lengths(prefix_ids)
  checks = [
      (tf.reduce_any(pieces.empty, axis=1), "an empty phrase"),
      (pieces.too_many, f"more than {2 * size} phrases"),
      (tf.reduce_any(pieces.too_long, axis=1),
       f"a phrase of more than {phrase_bytes(size)} bytes"),
      (tf.reduce_any(tf.equal(positive.row_lengths(axis=2), 0), axis=1)
       | tf.reduce_any(tf.equal(negative.row_lengths(axis=2), 0), axis=1),
       "a phrase of no subword piece"),
      (tf.reduce_any(tf.equal(positive.merge_dims(1, 2), UNK_ID), axis=1),
       "a phrase to include with a character the target vocabulary lacks"),
      (positive_count > size,
       f"more subword pieces to include than max_constraint_tokens={size}"),
      (negative.row_lengths(axis=1) > size,
       f"more phrases to avoid than max_constraint_tokens={size}"),
      (tf.reduce_any(negative.row_lengths(axis=2) > size, axis=1),
       f"a phrase to avoid of more subword pieces than max_constraint_tokens={size}"),
      # (without pieces to include, a prefix past the limit is cut there, as translate_prefix
      # does: the export's own warm-up prefixes are long val sentences)
      ((positive_count > 0) & (positive_count + prefix_count + 1 > limits),
       "more subword pieces to include (with the prefix and the end of the sentence) than "
       "the length limit of the output"),
  ]
  # (a 0 after the rows: argmax fails on a request of no row)
  asserts = [tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [
      f"constraints: {problem} in row", tf.argmax(tf.concat([tf.cast(bad, tf.int32), [0]], 0))])
      for bad, problem in checks]
  return asserts
