"""A row's text read at its bound, in-graph: its first max_length subword pieces, tokenized
from at most BYTES_PER_PIECE x max_length bytes of it, so that a line of any size costs bounded
memory (SentencePiece's lattice takes ~200 bytes a byte); and whether anything was left out."""

import tensorflow as tf

from data_pipeline.token_ids import EOS_ID, PAD_ID
from tf_transformer.serving.signatures import BYTES_PER_PIECE


def pieces(tokenizer, texts, max_length: int):
  """string [B] -> ragged int32 [B, (<= max_length)]: the first max_length subword pieces of
  each text, read from its first BYTES_PER_PIECE x max_length bytes."""
  heads = tf.strings.substr(texts, 0, BYTES_PER_PIECE * max_length)
  return tokenizer.tokenize(heads)[:, :max_length]


def ids(tokenizer, texts, max_length: int):
  """string [B] -> int32 [B, L]: `pieces` of each text + EOS, PAD_ID-padded (L: the most
  pieces + 1). EOS is written into the padded tensor: a ragged concatenation would cost each
  signature's tracing a tenth of an export's time."""
  read = pieces(tokenizer, texts, max_length)
  padded = tf.pad(read.to_tensor(default_value=PAD_ID), [[0, 0], [0, 1]],
                  constant_values=PAD_ID)
  ends = tf.cast(read.row_lengths(), tf.int32)[:, None]
  return tf.where(tf.range(tf.shape(padded)[1])[None, :] == ends, EOS_ID, padded)


def cut(tokenizer, texts, max_length: int):
  """string [B] -> bool [B]: the texts of which `pieces` leaves something out: more than
  max_length pieces, or more than white space after the bytes it reads."""
  read, length = BYTES_PER_PIECE * max_length, tf.strings.length(texts)
  rest = tf.strings.substr(texts, tf.minimum(length, read), length)
  many = tf.cast(tokenizer.tokenize(tf.strings.substr(texts, 0, read)).row_lengths(),
                 tf.int32) > max_length
  return many | tf.logical_not(tf.strings.regex_full_match(rest, r"\s*"))
