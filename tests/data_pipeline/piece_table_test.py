"""Tests of data_pipeline/piece_table.py against the `sentencepiece` library's own pieces, looked up
in the table by hand (the test of the same against transformers' MarianTokenizer is in
tests/tf_transformer/bin/import_marian_test.py)."""

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from data_pipeline import tokenizer
from data_pipeline.piece_table import PieceTableTokenizer
from data_pipeline.token_ids import UNK_ID
from tests import testutil

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
  """(PieceTableTokenizer, the sentencepiece processor of its model, its table): a model
  trained here, whose pieces take ids in the reverse of its own order, with a language code
  and without two of its pieces (which the table must read as UNK_ID)."""
  path = str(tmp_path_factory.mktemp("piece_table") / "source.spm")
  sentences = [" ".join(pair) for pair in testutil.sentence_pairs(300, seed=4)]
  tokenizer.train_sentencepiece(sentences, path, vocab_size=120)
  processor = sentencepiece.SentencePieceProcessor(model_file=path)
  own = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
         if not processor.is_control(i) and not processor.is_unknown(i)]
  dropped = own[-2:]
  pieces = SPECIALS + [">>fr<<"] + [piece for piece in reversed(own) if piece not in dropped]
  sentencepiece_tf = tokenizer.load_tokenizer(path, out_type=tf.string)
  return PieceTableTokenizer(sentencepiece_tf, pieces), processor, pieces, dropped


def _expected(processor, pieces, text):
  ids = {piece: i for i, piece in enumerate(pieces)}
  code = []
  if text.startswith(">>") and "<<" in text:
    end = text.index("<<") + 2
    code, text = [text[:end]], text[end:]
  return [ids.get(piece, UNK_ID) for piece in code + processor.encode(text, out_type=str)]


def test_tokenize_gives_each_piece_its_tables_id(table):
  piece_table, processor, pieces, dropped = table
  texts = [" ".join(pair) for pair in testutil.sentence_pairs(40, seed=9)] + [
      "", "  two  spaces ", "ß € 日本 🙂", ">>fr<< a code first", ">>fr<<", "not >>fr<< first",
      ">>xx<< an unknown code", dropped[0].replace("\u2581", " ").strip()]
  got = piece_table.tokenize(tf.constant(texts)).to_list()
  want = [_expected(processor, pieces, text) for text in texts]
  assert got == want
  assert got[-4][0] == pieces.index(">>fr<<") and got[-2][0] == UNK_ID
  assert any(UNK_ID in row for row in got[:-8] + got[-1:]), "the dropped pieces are UNK_ID"


def test_detokenize_joins_the_pieces_and_leaves_out_the_special_ids(table):
  piece_table, _, pieces, _ = table
  texts = ["the cat sat", "a b c d"]
  ids = piece_table.tokenize(tf.constant(texts))
  padded = ids.to_tensor(default_value=0)
  with_specials = tf.concat([tf.fill([2, 1], 2), padded, tf.fill([2, 1], 3),
                             tf.fill([2, 1], UNK_ID)], axis=1)
  round_trip = [text.decode() for text in piece_table.detokenize(with_specials).numpy()]
  assert round_trip == texts
  assert [t.decode() for t in piece_table.detokenize(ids).numpy()] == texts
  np.testing.assert_array_equal(piece_table.id_to_string(tf.constant([0, 3, 4])).numpy(),
                                [b"<pad>", b"</s>", b">>fr<<"])
  assert int(piece_table.vocab_size()) == len(pieces)


def test_a_saved_model_holding_it_tokenizes_alike(table, tmp_path):
  piece_table, _, _, _ = table
  module = tf.Module()
  module.table = piece_table
  module.tokenize = tf.function(
      lambda texts: piece_table.tokenize(texts).to_tensor(default_value=-1),
      input_signature=[tf.TensorSpec([None], tf.string)])
  tf.saved_model.save(module, str(tmp_path / "saved"))
  loaded = tf.saved_model.load(str(tmp_path / "saved"))
  texts = tf.constant([">>fr<< the cat", "ß sat"])
  np.testing.assert_array_equal(loaded.tokenize(texts).numpy(),
                                piece_table.tokenize(texts).to_tensor(default_value=-1).numpy())
