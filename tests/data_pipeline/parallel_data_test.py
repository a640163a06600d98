"""Tests of data_pipeline/parallel_data.py: a task's text corpora, vocabulary and batches."""

import os
import shutil

import pytest
import sentencepiece as spm

from data_pipeline import corpora
from data_pipeline.parallel_data import ParallelData
from data_pipeline.token_ids import UNK_ID
from tests import testutil
from tf_transformer.config import DataConfig


def _config(data_dir, **kwargs):
  defaults = dict(data_dir=str(data_dir), vocab_size=100, max_length=60, batch_tokens=512,
                  shuffle_buffer=100, dev_prefix="val")
  defaults.update(kwargs)
  return DataConfig(**defaults)


@pytest.fixture
def data_dir(tmp_path):
  directory = tmp_path / "data"
  directory.mkdir()
  testutil.write_pairs(directory, "train", testutil.sentence_pairs(150, seed=11))
  testutil.write_pairs(directory, "val", testutil.sentence_pairs(20, seed=12), gz=True)
  return directory


def test_parallel_data_trains_then_reuses_model(data_dir, tmp_path):
  model_dir = str(tmp_path / "model")
  config = _config(data_dir)
  data = ParallelData(config, model_dir)
  model_path = os.path.join(model_dir, "spm.joint.model")
  assert os.path.isfile(model_path)
  assert data.vocabulary.source is data.vocabulary.target
  assert data.train_corpora == [(str(data_dir / "train.en"), str(data_dir / "train.de"),
                                 corpora.CorpusScan(150, 0, ()), "de")]
  assert data.dev_sets == {"de": (str(data_dir / "val.en.gz"), str(data_dir / "val.de.gz"),
                                  corpora.CorpusScan(20, 0, ()))}
  mtime = os.stat(model_path).st_mtime_ns
  size = data.vocabulary.source_size

  again = ParallelData(config, model_dir)
  assert os.stat(model_path).st_mtime_ns == mtime
  assert again.vocabulary.source_size == size
  assert sorted(os.listdir(model_dir)) == ["spm.joint.model"]

  dev_pairs = again.dev_pairs()
  assert list(dev_pairs) == ["de"]
  assert len(dev_pairs["de"]) == 20 and len(again.dev_pairs(limit=3)["de"]) == 3
  dev_examples = sum(s.shape[0] for s, _, _ in again.dev_batches().as_numpy_iterator())
  assert dev_examples == 20
  source, target_input, target = next(iter(again.train_batches(seed=1)))
  assert source.shape[0] * source.shape[1] <= config.batch_tokens
  assert again.test_pairs() == {}


def test_parallel_data_unshared(data_dir, tmp_path):
  model_dir = str(tmp_path / "model")
  data = ParallelData(_config(data_dir, shared_vocab=False, dev_prefix=None, test_prefix="val",
                              spm_model_type="bpe"), model_dir)
  assert sorted(os.listdir(model_dir)) == ["spm.de.model", "spm.en.model"]
  assert data.vocabulary.source is not data.vocabulary.target
  assert data.dev_batches() is None and data.dev_pairs() == {}
  assert len(data.test_pairs()["de"]) == 20


def test_byte_fallback_leaves_no_unknown_piece_in_the_batches(data_dir, tmp_path):
  """--spm_byte_fallback reaches the subword models the pipeline trains: a character seen
  once in training (under SentencePiece's 0.05% coverage cut) or never is <unk> without it,
  its UTF-8 bytes with it, on both sides."""
  rare = [("ein ☃ hier", "un 漢 là"), ("das Ý", "le $")]
  testutil.write_pairs(data_dir, "train", testutil.sentence_pairs(150, seed=11) + rare[:1])
  testutil.write_pairs(data_dir, "val", rare, gz=True)
  unknown = {}
  for byte_fallback in (False, True):
    data = ParallelData(_config(data_dir, vocab_size=400, spm_byte_fallback=byte_fallback),
                        str(tmp_path / f"model_{byte_fallback}"))
    batches = list(data.dev_batches().as_numpy_iterator())
    unknown[byte_fallback] = [int(any(UNK_ID in batch[side] for batch in batches))
                              for side in (0, 2)]  # source, target
  assert unknown == {False: [1, 1], True: [0, 0]}


def test_parallel_data_mismatched_train(data_dir, tmp_path):
  testutil.write_lines(data_dir / "train.de", [t for _, t in testutil.sentence_pairs(151, seed=11)])
  src, tgt = str(data_dir / "train.en"), str(data_dir / "train.de")
  model_dir = str(tmp_path / "model")
  with pytest.raises(corpora.CorpusError) as e:
    ParallelData(_config(data_dir), model_dir)
  assert str(e.value) == (f"{src} has 150 lines but {tgt} has 151; "
                          "parallel files must be line-aligned")
  assert not os.path.exists(os.path.join(model_dir, "spm.joint.model"))


def test_parallel_data_missing_dev(data_dir, tmp_path):
  d = str(data_dir)
  with pytest.raises(corpora.CorpusError) as e:
    ParallelData(_config(data_dir, dev_prefix="dev"), str(tmp_path / "model"))
  assert str(e.value) == (f"{d}/dev.en: no such file (nor {d}/dev.en.gz); "
                          "check data_dir and the prefixes")


def test_parallel_data_skips_bad_lines(data_dir, tmp_path):
  pairs = testutil.sentence_pairs(150, seed=11)
  src = [s.encode() for s, _ in pairs]
  src[5] = b"\xff" + src[5]
  testutil.write_lines(data_dir / "train.en", src)
  with pytest.raises(corpora.CorpusError) as e:
    ParallelData(_config(data_dir), str(tmp_path / "model"))
  assert str(e.value) == (f"{data_dir}/train.en:6: not valid UTF-8 (byte 0xff at column 1); "
                          "fix the file or pass on_bad_line=skip")
  data = ParallelData(_config(data_dir, on_bad_line="skip"), str(tmp_path / "model"))
  assert data.train_corpora[0].scan.bad_lines == (5,)
  train = list(data.train_pairs().as_numpy_iterator())
  assert len(train) == 149
  assert (pairs[5][0].encode(), pairs[5][1].encode()) not in train


def test_parallel_data_nothing_left(data_dir, tmp_path, vocabulary):
  model_dir = tmp_path / "model"
  model_dir.mkdir()  # an existing model is reused (saves training one here)
  shutil.copy(vocabulary.source_model_path, model_dir / "spm.joint.model")
  with pytest.raises(corpora.CorpusError) as e:
    ParallelData(_config(data_dir, max_length=1), str(model_dir))
  assert str(e.value) == (f"{data_dir}/train.en: no pair left for training "
                          "(all empty, invalid or over max_length=1)")


def test_the_log_counts_the_pairs_dropped_and_skipped(data_dir, tmp_path, vocabulary, caplog,
                                                      monkeypatch):
  """The counts of the train lines, empty and non-UTF-8 pairs, and pairs over --max_length
  (a side's pieces, SentencePiece's own count, before EOS), as a user reads them in the log."""
  pairs = testutil.sentence_pairs(150, seed=11)
  sources, targets = [s.encode() for s, _ in pairs], [t.encode() for _, t in pairs]
  sources[5] = b"\xff" + sources[5]
  sources[9] = targets[9] = b""
  testutil.write_lines(data_dir / "train.en", sources)
  testutil.write_lines(data_dir / "train.de", targets)
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  shutil.copy(vocabulary.source_model_path, model_dir / "spm.joint.model")
  pieces = spm.SentencePieceProcessor(model_file=vocabulary.source_model_path)
  max_length = 15
  kept = [i for i, (s, t) in enumerate(pairs) if i not in (5, 9)]
  too_long = sum(max(len(pieces.encode(pairs[i][0])), len(pieces.encode(pairs[i][1]))) > max_length
                 for i in kept)
  assert 0 < too_long < len(kept)
  testutil.capture_absl_info(caplog, monkeypatch)
  ParallelData(_config(data_dir, on_bad_line="skip", max_length=max_length), str(model_dir))
  messages = [r.getMessage() for r in caplog.records]
  assert (f"train: 150 lines in {data_dir}/train.en / {data_dir}/train.de; 1 empty pairs "
          "dropped; 1 non-UTF-8 pairs skipped") in messages
  assert (f"train: {len(kept) - too_long} pairs kept, {too_long} dropped over "
          f"max_length={max_length} subword tokens") in messages


def test_a_shuffle_buffer_over_the_corpus_size_is_cut_to_it(data_dir, tmp_path):
  """The batches are those of the buffer asked for, and a checkpoint of the iterator stays
  small: TensorFlow writes every slot of a shuffle buffer, empty ones too (26 MB for 100,000)."""
  import numpy as np
  import tensorflow as tf

  from data_pipeline import pipeline

  data = ParallelData(_config(data_dir, shuffle_buffer=100_000), str(tmp_path / "model"))
  ours = iter(data.train_batches(seed=3))
  asked = iter(pipeline.train_batches([(data.train_pairs(), 100_000)], data.vocabulary, 60, 512,
                                      3))
  for _ in range(40):  # several epochs of the 150 pairs
    for got, want in zip(next(ours), next(asked)):
      np.testing.assert_array_equal(got.numpy(), want.numpy())
  path = tf.train.Checkpoint(iterator=ours).write(str(tmp_path / "ckpt" / "iterator"))
  size = sum(os.path.getsize(name) for name in tf.io.gfile.glob(path + ".data-*"))
  assert size < 1_000_000, size
