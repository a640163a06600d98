"""Subword regularization (--subword_alpha): each training sentence segmented anew each time it
is read, every segmentation spelling the same sentence; dev batches and alpha 0 keep the one best
segmentation."""

import collections

import numpy as np
import pytest

from data_pipeline.parallel_data import ParallelData
from data_pipeline.token_ids import EOS_ID, PAD_ID
from tf_transformer.config import ConfigError, DataConfig
from tests import testutil

WORDS = ("translation transformer attention tokenizer segmentation regularization "
         "sentence subword training decoding encoder decoder").split()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("corpus")
  rng = np.random.default_rng(0)
  sources = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 6)))) for _ in range(40)]
  testutil.write_corpus(folder, "train", sources, [" ".join(s.split()[::-1]) for s in sources])
  return folder


def _data(data_dir, model_dir, **kwargs):
  return ParallelData(DataConfig(**{**dict(
      data_dir=str(data_dir), src_lang="src", tgt_lang="tgt", vocab_size=60, max_length=64,
      batch_tokens=512, shuffle_buffer=40, dev_prefix="train"), **kwargs}), str(model_dir))


def _rows(ids: np.ndarray) -> list[tuple[int, ...]]:
  """Padded id rows [B, L] -> their ids before EOS."""
  return [tuple(int(i) for i in row if i not in (PAD_ID, EOS_ID)) for row in ids]


def _segmentations(data, batches: int) -> tuple[dict[str, set], dict[str, set]]:
  """({source text: its distinct source segmentations}, the same of the targets) over `batches`
  training batches, each row's text checked to detokenize to a corpus sentence."""
  (dev,) = data.dev_pairs().values()
  sentences = {s for s, _ in dev}
  targets = {t for _, t in dev}
  seen = collections.defaultdict(set), collections.defaultdict(set)
  for source, _, target in data.train_batches(seed=1).take(batches).as_numpy_iterator():
    for side, ids, tokenizer, corpus in ((0, source, data.vocabulary.source, sentences),
                                         (1, target, data.vocabulary.target, targets)):
      texts = [t.decode() for t in tokenizer.detokenize(ids).numpy()]
      assert set(texts) <= corpus
      for text, row in zip(texts, _rows(ids)):
        seen[side][text].add(row)
  return seen


@pytest.mark.parametrize("model_type, alpha", [("unigram", 0.1), ("bpe", 0.2)])
def test_a_sentence_is_segmented_anew_each_time_it_is_read(data_dir, tmp_path, model_type,
                                                           alpha):
  """About 10 reads of each of 40 sentences: most come out in several segmentations (a BPE
  model by dropping merges), each spelling the sentence; a unigram model's best segmentation,
  the most probable, is among them for most."""
  data = _data(data_dir, tmp_path, subword_alpha=alpha, spm_model_type=model_type)
  seen, _ = _segmentations(data, batches=60)
  assert len(seen) == 40
  varied = sum(len(rows) > 1 for rows in seen.values())
  assert varied >= 30, {text: len(rows) for text, rows in seen.items()}
  if model_type == "unigram":
    best = {text: tuple(data.vocabulary.source.tokenize(text).numpy()) for text in seen}
    assert sum(best[text] in rows for text, rows in seen.items()) >= 20


def test_nbest_size_bounds_the_segmentations_drawn_among(data_dir, tmp_path):
  """--subword_nbest_size=2: every segmentation read is one of the sentence's two best
  (SentencePiece's own n-best list), and most sentences show both; with all (-1) some
  segmentation falls outside them."""
  import sentencepiece  # only to list the n-best segmentations as a reference

  two = _data(data_dir, tmp_path, subword_alpha=0.1, subword_nbest_size=2)
  reference = sentencepiece.SentencePieceProcessor(
      model_file=two.vocabulary.source_model_path)
  two_best = {}
  seen, _ = _segmentations(two, batches=30)
  for text, rows in seen.items():
    two_best[text] = {tuple(ids) for ids in reference.nbest_encode_as_ids(text, 2)}
    assert rows <= two_best[text], text
  assert sum(len(rows) == 2 for rows in seen.values()) >= 20
  every, _ = _segmentations(_data(data_dir, tmp_path, subword_alpha=0.1), batches=30)
  assert sum(bool(rows - two_best[text]) for text, rows in every.items()) >= 20


def test_alpha_0_and_the_dev_batches_keep_the_best_segmentation(data_dir, tmp_path):
  plain = _data(data_dir, tmp_path)
  sampling = _data(data_dir, tmp_path, subword_alpha=0.1)  # the same subword model
  seen, _ = _segmentations(plain, batches=30)
  for text, rows in seen.items():
    assert rows == {tuple(plain.vocabulary.source.tokenize(text).numpy())}, text
  dev = [list(data.dev_batches().as_numpy_iterator()) for data in (plain, sampling, sampling)]
  for batches in dev[1:]:
    assert len(batches) == len(dev[0])
    for got, want in zip(batches, dev[0]):
      for got_part, want_part in zip(got, want):
        np.testing.assert_array_equal(got_part, want_part)


@pytest.mark.parametrize("shared_vocab", [True, False])
@pytest.mark.parametrize("sides", ["source", "target"])
def test_one_side_sampled_the_other_keeps_its_best_segmentation(data_dir, tmp_path, sides,
                                                                shared_vocab):
  """--subword_sides: the side named comes out in several segmentations, the other in its one
  best, also when both sides share one subword model."""
  data = _data(data_dir, tmp_path, subword_alpha=0.1, subword_sides=sides,
               shared_vocab=shared_vocab)
  source, target = _segmentations(data, batches=60)
  sampled, kept = (source, target) if sides == "source" else (target, source)
  tokenizer = data.vocabulary.target if sides == "source" else data.vocabulary.source
  assert len(sampled) == len(kept) == 40
  assert sum(len(rows) > 1 for rows in sampled.values()) >= 30
  for text, rows in kept.items():
    assert rows == {tuple(tokenizer.tokenize(text).numpy())}, text


@pytest.mark.parametrize("settings, field", [
    (dict(subword_alpha=0.1, subword_nbest_size=1), "subword_nbest_size=1"),
    (dict(subword_alpha=0.1, subword_nbest_size=0), "subword_nbest_size=0"),
    (dict(subword_alpha=1.5), "subword_alpha=1.5"),
    (dict(subword_alpha=-0.1), "subword_alpha=-0.1"),
    (dict(subword_nbest_size=-2), "subword_nbest_size=-2"),
    (dict(subword_sides="neither"), "subword_sides='neither'")])
def test_bad_settings_are_one_config_error(settings, field):
  with pytest.raises(ConfigError, match=f"^DataConfig: {field} ") as error:
    DataConfig(data_dir="data", **settings)
  assert "\n" not in str(error.value)
