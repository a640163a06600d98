"""Source token dropout (--source_token_dropout): training source pieces become <unk> at the
rate asked, drawn anew at each read and resumed with the iterator; EOS, padding, targets and a
multilingual model's language token are never touched."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline import language_tags
from data_pipeline.parallel_data import ParallelData
from data_pipeline.token_ids import EOS_ID, PAD_ID, UNK_ID
from tests import testutil
from tests.data_pipeline.language_tags_test import multilingual_data
from tf_transformer.config import ConfigError, DataConfig

WORDS = "the cat sat on a mat and dog ran to house under tree".split()
RATE = 0.3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("corpus")
  rng = np.random.default_rng(0)
  sources = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 9)))) for _ in range(60)]
  testutil.write_corpus(folder, "train", sources, [" ".join(s.split()[::-1]) for s in sources])
  return folder


def _data(data_dir, model_dir, **kwargs):
  return ParallelData(DataConfig(
      data_dir=str(data_dir), src_lang="src", tgt_lang="tgt", vocab_size=40, max_length=40,
      batch_tokens=400, shuffle_buffer=60, dev_prefix=None, **kwargs), str(model_dir))


def _batches(data, count, seed=1):
  return [tuple(t.numpy() for t in batch) for batch in data.train_batches(seed).take(count)]


def test_pieces_become_unk_at_the_rate_and_nothing_else_changes(data_dir, tmp_path):
  """The same batches as without dropout (the order does not depend on it), but for source
  pieces turned to <unk>: over 60 batches (about 9,000 pieces), their share is RATE within
  0.02 (the binomial's standard deviation is 0.005)."""
  clean = _batches(_data(data_dir, tmp_path / "model"), 60)
  noisy = _batches(_data(data_dir, tmp_path / "model", source_token_dropout=RATE), 60)
  dropped = pieces = 0
  for (source, target_input, target), (want_source, want_input, want_target) in zip(noisy,
                                                                                      clean):
    np.testing.assert_array_equal(target, want_target)
    np.testing.assert_array_equal(target_input, want_input)
    assert source.shape == want_source.shape
    changed = source != want_source
    assert (source[changed] == UNK_ID).all()
    assert not np.isin(want_source[changed], [EOS_ID, PAD_ID]).any()
    dropped += changed.sum()
    pieces += np.isin(want_source, [EOS_ID, PAD_ID], invert=True).sum()
  assert pieces > 8000
  assert abs(dropped / pieces - RATE) < 0.02, dropped / pieces


def test_each_read_draws_anew_and_one_seed_repeats_itself(data_dir, tmp_path):
  """About 20 reads of each of 60 sentences: nearly every sentence comes out with several masks;
  two pipelines of one seed draw the same, another seed draws otherwise."""
  data = _data(data_dir, tmp_path / "model", source_token_dropout=RATE)
  clean = _batches(_data(data_dir, tmp_path / "model"), 120)
  noisy = _batches(data, 120)
  masks = collections.defaultdict(set)
  for (source, _, _), (want, _, _) in zip(noisy, clean):
    for row, want_row in zip(source, want):
      masks[tuple(want_row)].add(tuple(row == UNK_ID))
  several = sum(len(seen) > 1 for seen in masks.values())
  assert len(masks) >= 55 and several >= 0.9 * len(masks), (several, len(masks))
  for got, want in zip(_batches(data, 10), noisy[:10]):
    np.testing.assert_array_equal(got[0], want[0])
  other = _batches(data, 10, seed=2)
  assert any(got[0].shape != want[0].shape or (got[0] != want[0]).any()
             for got, want in zip(other, noisy[:10]))


def test_a_resumed_iterator_draws_what_the_uninterrupted_one_draws(data_dir, tmp_path):
  data = _data(data_dir, tmp_path / "model", source_token_dropout=RATE)
  iterator = iter(data.train_batches(seed=1))
  for _ in range(7):
    next(iterator)
  path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt" / "iterator"))
  uninterrupted = [next(iterator)[0].numpy() for _ in range(8)]
  resumed = iter(data.train_batches(seed=1))
  tf.train.Checkpoint(iterator=resumed).read(path).assert_consumed()
  for want in uninterrupted:
    np.testing.assert_array_equal(next(resumed)[0].numpy(), want)


def test_a_multilingual_models_language_token_is_never_dropped(tmp_path):
  """At a rate of 0.9 nearly every other piece goes, but each source keeps its two tag pieces."""
  data = multilingual_data(tmp_path, source_token_dropout=0.9)
  tags = {int(data.vocabulary.source.string_to_id(language_tags.tag(lang)))
          for lang in ("de", "fr", "cs")}
  rest = dropped = 0
  for source, _, _ in data.train_batches(seed=1).take(20).as_numpy_iterator():
    assert set(source[:, language_tags.TAG_PIECES - 1].tolist()) <= tags
    assert UNK_ID not in source[:, :language_tags.TAG_PIECES]
    body = source[:, language_tags.TAG_PIECES:]
    real = np.isin(body, [EOS_ID, PAD_ID], invert=True)
    rest += real.sum()
    dropped += (body[real] == UNK_ID).sum()
  assert dropped / rest > 0.85, dropped / rest


@pytest.mark.parametrize("rate", [1.0, -0.1, float("nan")])
def test_a_rate_outside_zero_to_one_is_refused(rate):
  with pytest.raises(ConfigError, match=r"source_token_dropout=.* must be in \[0, 1\) \(0: off\)"):
    DataConfig(data_dir=".", source_token_dropout=rate)
