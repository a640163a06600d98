"""A SentencePiece model whose pieces take their ids from another table: a published Marian model's
vocabulary (OPUS-MT's vocab.json), one id space shared by a source and a target SentencePiece
model whose own ids differ from it. In-graph (tf-text and a `tf.lookup` table), so a SavedModel
that holds it stays string in, string out.

It reads and writes text as Hugging Face's MarianTokenizer does: a leading language code
(">>fra<<", multilingual models) is one piece of its own; the rest is segmented by the
SentencePiece model into pieces, each of which takes its id in the table (a piece the table
lacks, as the text of a character the model does not know, is UNK_ID); detokenizing joins the
pieces of the non-special ids and turns each "\u2581" into a space.
"""

import tensorflow as tf
import tensorflow_text as tf_text

from data_pipeline.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

_WORD_BOUNDARY = "\u2581"
# a leading language code of a multilingual model's source, as MarianTokenizer reads it
_LANGUAGE_CODE = r"(?s)^(>>.*?<<).*$"


class PieceTableTokenizer(tf.Module):
  """The tokenizer interface the library uses (tokenize, detokenize, id_to_string, vocab_size)
  over a SentencePiece model and a table of pieces.

  Args:
    sentencepiece: a tf_text.SentencepieceTokenizer of the model, out_type tf.string.
    pieces: the table, our ids in order: pieces[id] is the piece of id; the first four are
      PAD, UNK, BOS and EOS (data_pipeline.token_ids).
  """

  def __init__(self, sentencepiece: tf_text.SentencepieceTokenizer, pieces: list[str]):
    super().__init__()
    self._sentencepiece = sentencepiece
    self._size = len(pieces)
    self._pieces = tf.constant(pieces)  # -> [V]
    special = [PAD_ID, UNK_ID, BOS_ID, EOS_ID]
    self._text_pieces = tf.constant([
        "" if i in special else piece.replace(_WORD_BOUNDARY, " ")
        for i, piece in enumerate(pieces)])
    self._ids = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(pieces),
                                            tf.range(self._size, dtype=tf.int32)),
        default_value=UNK_ID)

  def vocab_size(self):
    return tf.constant(self._size)

  def tokenize(self, texts):
    """texts: string [N] -> int32 RaggedTensor [N, (pieces)]."""
    texts = tf.convert_to_tensor(texts)
    has_code = tf.strings.regex_full_match(texts, _LANGUAGE_CODE)
    codes = tf.where(has_code, tf.strings.regex_replace(texts, _LANGUAGE_CODE, r"\1"), "")
    rest = tf.strings.regex_replace(texts, r"(?s)^>>.*?<<", "", replace_global=False)
    pieces = self._sentencepiece.tokenize(rest)  # -> [N, (p)] strings
    code_pieces = tf.RaggedTensor.from_row_lengths(
        tf.boolean_mask(codes, has_code), tf.cast(has_code, tf.int64))  # -> [N, (0 or 1)]
    pieces = tf.concat([code_pieces, pieces], axis=1)
    return tf.ragged.map_flat_values(self._ids.lookup, pieces)

  def detokenize(self, ids):
    """ids: int [N, L] (or ragged) -> string [N]: the text of each row's pieces, the special
    ids (PAD, UNK, BOS, EOS) left out."""
    if not isinstance(ids, tf.RaggedTensor):
      ids = tf.RaggedTensor.from_tensor(ids)
    texts = tf.strings.reduce_join(
        tf.ragged.map_flat_values(tf.gather, self._text_pieces, ids), axis=-1)
    return tf.strings.strip(texts)

  def id_to_string(self, ids):
    """ids: int [...] -> their pieces, string [...]."""
    return tf.gather(self._pieces, ids)
