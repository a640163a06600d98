"""Tests for data_pipeline.tokenizer: SentencePiece training and in-graph tf-text tokenizers."""

import os
import unicodedata

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from data_pipeline import tokenizer
from data_pipeline.token_ids import PAD_ID

SENTENCES = [unicodedata.normalize("NFC", s) for s in [
    # English
    "The quick brown fox jumps over the lazy dog.",
    "I like machine translation very much.",
    "Where is the train station?",
    # German
    "Über den Wolken muss die Freiheit grenzenlos sein.",
    "Schöne Grüße aus München!",
    "Die Mädchen äßen gern Käse und Brötchen.",
    # Vietnamese
    "Tôi yêu tiếng Việt",
    "Xin chào, bạn có khỏe không?",
    "Hôm nay trời đẹp quá.",
    # Japanese, no spaces
    "私は学生です",
    "今日は良い天気ですね。",
    "日本語を勉強しています",
]]


def _corpus(num_lines=300, seed=0):
  """A small multilingual corpus: each line is one or two of SENTENCES (every one included)."""
  rng = np.random.default_rng(seed)
  lines = list(SENTENCES)
  while len(lines) < num_lines:
    picks = rng.choice(len(SENTENCES), size=int(rng.integers(1, 3)))
    lines.append(" ".join(SENTENCES[i] for i in picks))
  return lines


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def model(request, tmp_path_factory):
  """(model_type, model path, tokenizer) of a tiny model trained on _corpus()."""
  path = str(tmp_path_factory.mktemp(f"spm_{request.param}") / "sub" / "spm.model")
  tokenizer.train_sentencepiece(_corpus(), path, vocab_size=200, model_type=request.param)
  return request.param, path, tokenizer.load_tokenizer(path)


def test_ids():
  assert (PAD_ID, tokenizer.UNK_ID, tokenizer.BOS_ID, tokenizer.EOS_ID) == (0, 1, 2, 3)


def test_train_writes_model_only(model):
  _, path, _ = model
  assert os.path.isfile(path)
  assert os.listdir(os.path.dirname(path)) == ["spm.model"]  # temporary files cleaned up


def test_model_is_a_sentencepiece_tokenizer(model):
  _, _, tok = model
  assert isinstance(tok, tf_text.SentencepieceTokenizer)
  assert 20 < int(tok.vocab_size()) <= 200


def test_special_ids(model):
  _, _, tok = model
  pieces = [p.decode() for p in tok.id_to_string(tf.constant([0, 1, 2, 3])).numpy()]
  assert pieces == ["<pad>", "<unk>", "<s>", "</s>"]


@pytest.mark.parametrize("sentence", SENTENCES + [
    "Grüße aus Köln und München",
    "Tôi yêu tiếng Việt",
    "私は学生です",
    "The fox likes Käse.",
])
def test_round_trip(model, sentence):
  _, _, tok = model
  ids = tok.tokenize(tf.constant(sentence))
  assert ids.dtype == tf.int32
  ids_list = ids.numpy().tolist()
  assert ids_list and tokenizer.UNK_ID not in ids_list
  assert not {PAD_ID, tokenizer.BOS_ID, tokenizer.EOS_ID} & set(ids_list)
  assert tok.detokenize(ids).numpy().decode("utf-8") == sentence


def test_round_trip_batch(model):
  _, _, tok = model
  ids = tok.tokenize(tf.constant(SENTENCES))
  assert isinstance(ids, tf.RaggedTensor) and ids.shape[0] == len(SENTENCES)
  texts = [t.decode("utf-8") for t in tok.detokenize(ids).numpy()]
  assert texts == SENTENCES


def test_japanese_is_split_into_pieces(model):
  _, _, tok = model
  # Without spaces the sentence is still segmented (not one unknown token).
  ids = tok.tokenize(tf.constant("日本語を勉強しています私は学生です")).numpy().tolist()
  assert len(ids) > 1 and tokenizer.UNK_ID not in ids


def test_unknown_character(model):
  _, _, tok = model
  ids = tok.tokenize(tf.constant("☃")).numpy().tolist()
  assert tokenizer.UNK_ID in ids


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_byte_fallback_reads_and_writes_every_character(tmp_path, model_type):
  """Characters the model keeps no piece for (☃, 漢, and "Ý", "$" rarer than 0.05% of the
  text) become their UTF-8 bytes instead of <unk>: nothing is lost from tokenize to
  detokenize, in-graph and with sampled segmentations too; without byte fallback they are
  <unk>. A byte sequence that is not UTF-8 (a decoder may write one) becomes U+FFFD."""
  rare = ["Ý $5 đội"] + _corpus(4000)
  texts = ["đội Ý ghi bàn $5 ☃ 漢", "Tôi yêu tiếng Việt"]
  unknown = {}
  for byte_fallback in (False, True):
    path = str(tmp_path / f"{byte_fallback}.model")
    tokenizer.train_sentencepiece(rare, path, vocab_size=400, model_type=model_type,
                                  byte_fallback=byte_fallback)
    tok = tokenizer.load_tokenizer(path)
    ids = tok.tokenize(texts)
    unknown[byte_fallback] = tokenizer.UNK_ID in ids.flat_values.numpy()
    if byte_fallback:
      assert [t.decode() for t in tok.detokenize(ids).numpy()] == texts
      sampling = tokenizer.load_tokenizer(path, alpha=0.1)
      assert [t.decode() for t in tok.detokenize(sampling.tokenize(texts)).numpy()] == texts
      first_byte = int(tok.string_to_id("<0xC3>"))  # "Ý" is C3 9D
      assert tok.detokenize([[first_byte]]).numpy()[0].decode() == "\ufffd"
  assert unknown == {False: True, True: False}


def test_a_vocabulary_smaller_than_its_characters_is_a_one_line_error(tmp_path):
  path = str(tmp_path / "spm.model")
  with pytest.raises(tokenizer.VocabularyError) as error:
    tokenizer.train_sentencepiece(_corpus(100), path, vocab_size=100, byte_fallback=True)
  needed = int(str(error.value).split("give vocab_size=")[1].split()[0])
  assert str(error.value) == (
      f"vocab_size=100 is too small for {path}: SentencePiece keeps {needed} pieces whole "
      "(the text's characters, the special pieces, the 256 bytes of spm_byte_fallback); give "
      f"vocab_size={needed} or more")
  assert error.value.as_flags() == (
      f"--vocab_size=100 is too small for {path}: SentencePiece keeps {needed} pieces whole "
      "(the text's characters, the special pieces, the 256 bytes of --spm_byte_fallback); give "
      f"--vocab_size={needed} or more")
  assert not os.path.exists(path)
  tokenizer.train_sentencepiece(_corpus(100), path, vocab_size=needed, byte_fallback=True)


def test_a_tokenizer_outlives_tensorflows_kernel_cache_being_cleared(model):
  """tf.random.set_seed (and keras.utils.set_random_seed) clears the eager kernel cache, which
  holds tf-text's own SentencePiece resource: a tokenizer loaded before the seed must still
  work after it."""
  _, path, _ = model
  loaded = tokenizer.load_tokenizer(path)
  sampling = tokenizer.load_tokenizer(path, alpha=0.5)
  before = loaded.tokenize(SENTENCES).to_list()
  tf.random.set_seed(3)
  assert loaded.tokenize(SENTENCES).to_list() == before
  assert int(loaded.vocab_size()) == int(sampling.vocab_size()) > 0
  assert loaded.detokenize(sampling.tokenize(SENTENCES)).numpy().tolist() == [
      s.encode() for s in SENTENCES]


def test_train_in_current_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  tokenizer.train_sentencepiece(_corpus(100), "plain.model", vocab_size=150)
  assert sorted(os.listdir(tmp_path)) == ["plain.model"]


def test_train_replaces_existing_model(tmp_path):
  path = str(tmp_path / "spm.model")
  with open(path, "wb") as f:
    f.write(b"stale")
  tokenizer.train_sentencepiece(_corpus(100), path, vocab_size=150, model_type="bpe")
  tok = tokenizer.load_tokenizer(path)
  assert tok.detokenize(tok.tokenize(tf.constant("Tôi yêu tiếng Việt"))).numpy().decode() == (
      "Tôi yêu tiếng Việt")


# ---------------------------------------------------------------- vocabulary


def test_vocabulary_paths_shared(tmp_path):
  d = str(tmp_path)
  assert tokenizer.vocabulary_paths(d, True, "en", "de") == (f"{d}/spm.joint.model",) * 2


def test_vocabulary_paths_unshared(tmp_path):
  d = str(tmp_path)
  assert tokenizer.vocabulary_paths(d, False, "en", "de") == (f"{d}/spm.en.model",
                                                               f"{d}/spm.de.model")


def test_load_vocabulary_shared(model):
  _, path, _ = model
  vocab = tokenizer.load_vocabulary(path, path)
  assert vocab.source is vocab.target
  assert vocab.source_model_path == vocab.target_model_path == path
  assert vocab.source_size == vocab.target_size == int(vocab.source.vocab_size())


def test_load_vocabulary_unshared(tmp_path):
  source_path, target_path = tokenizer.vocabulary_paths(str(tmp_path), False, "en", "ja")
  assert source_path != target_path
  tokenizer.train_sentencepiece(SENTENCES[:6] * 20, source_path, vocab_size=100)
  tokenizer.train_sentencepiece(SENTENCES[9:] * 20, target_path, vocab_size=50)
  vocab = tokenizer.load_vocabulary(source_path, target_path)
  assert vocab.source is not vocab.target
  assert (vocab.source_model_path, vocab.target_model_path) == (source_path, target_path)
  assert vocab.source_size != vocab.target_size
  # Each side knows only its own language.
  assert tokenizer.UNK_ID not in vocab.target.tokenize(tf.constant("私は学生です")).numpy()
  assert tokenizer.UNK_ID in vocab.source.tokenize(tf.constant("私は学生です")).numpy()


def test_wait_for_vocabulary_returns_once_the_chief_wrote_it_and_times_out_otherwise(tmp_path):
  from tf_transformer.config import DataConfig
  config = DataConfig(shared_vocab=False, src_lang="en", tgt_lang="de")
  with pytest.raises(TimeoutError, match="the chief worker wrote no subword model"):
    tokenizer.wait_for_vocabulary(str(tmp_path), config, timeout_s=0.2, poll_s=0.05)
  (tmp_path / "spm.en.model").write_bytes(b"x")
  with pytest.raises(TimeoutError):  # both sides are needed
    tokenizer.wait_for_vocabulary(str(tmp_path), config, timeout_s=0.2, poll_s=0.05)
  (tmp_path / "spm.de.model").write_bytes(b"x")
  tokenizer.wait_for_vocabulary(str(tmp_path), config, timeout_s=0.2, poll_s=0.05)


def test_subword_models_go_through_tensorflow_file_systems(tmp_path):
  from tf_transformer.config import DataConfig
  model_dir = f"file://{tmp_path}/model"
  config = DataConfig(vocab_size=150, src_lang="en", tgt_lang="de")
  sides = []

  def sentences(side):
    sides.append(side)
    return iter(_corpus(100))

  vocabulary = tokenizer.ensure_vocabulary(model_dir, config, sentences)
  assert vocabulary.source_model_path == f"{model_dir}/spm.joint.model"
  assert os.listdir(tmp_path / "model") == ["spm.joint.model"]  # no temporary left
  tokenizer.ensure_vocabulary(model_dir, config, sentences)  # found, so not trained again
  assert sides == ["both"]
  tokenizer.wait_for_vocabulary(model_dir, config, timeout_s=0.2, poll_s=0.05)
