"""Tests for data_pipeline.pipeline (tf.data pipelines) and data_pipeline.parallel_data."""

import collections
import dataclasses
import gzip
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline import bucketing, corpora, pipeline, tokenizer
from data_pipeline.parallel_data import ParallelData
from data_pipeline.tokenizer import BOS_ID, EOS_ID
from tf_transformer.config import DataConfig
from tf_transformer.layers.attention_bias import PAD_ID

EN_WORDS = ("the a cat dog house tree river sees likes runs quickly small big green old "
            "young man woman child city near under with").split()
DE_WORDS = ("der die das eine Katze Hund Haus Baum Fluss sieht mag läuft schnell klein groß "
            "grün alt jung Mann Frau Kind Stadt nahe unter mit über Brücke").split()


def _corpus(num, seed, max_words=25):
  """`num` random (english-ish, german-ish) sentence pairs of 1..max_words words."""
  rng = np.random.default_rng(seed)

  def sentence(words):
    return " ".join(rng.choice(words, size=int(rng.integers(1, max_words + 1))))

  return [(sentence(EN_WORDS), sentence(DE_WORDS)) for _ in range(num)]


def _write(path, lines, gz=False):
  data = b"".join((l if isinstance(l, bytes) else l.encode("utf-8")) + b"\n" for l in lines)
  if gz:
    with gzip.open(path, "wb") as f:
      f.write(data)
  else:
    with open(path, "wb") as f:
      f.write(data)
  return str(path)


def _write_pairs(directory, prefix, pairs, gz=False, langs=("en", "de")):
  suffix = ".gz" if gz else ""
  return (_write(os.path.join(directory, f"{prefix}.{langs[0]}{suffix}"), [p[0] for p in pairs],
                 gz),
          _write(os.path.join(directory, f"{prefix}.{langs[1]}{suffix}"), [p[1] for p in pairs],
                 gz))


def _pairs_dataset(pairs):
  return tf.data.Dataset.from_tensor_slices(
      ([s for s, _ in pairs], [t for _, t in pairs]))


def _ids(tok, texts):
  return tok.tokenize(tf.constant(texts)).to_list()


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vocab") / "spm.joint.model")
  sentences = [s for pair in _corpus(300, seed=1) for s in pair]
  tokenizer.train_sentencepiece(sentences, path, vocab_size=100)
  return tokenizer.load_vocabulary(path, path)


# ---------------------------------------------------------------- text_pairs


@pytest.mark.parametrize("gz", [False, True])
def test_text_pairs_drops_empty_pairs(tmp_path, gz):
  pairs = [(" a b ", "A B"), ("", "x"), ("c", "  "), ("d\t", " D"), ("   ", ""), ("e", "E")]
  src, tgt = _write_pairs(tmp_path, "train", pairs, gz)
  got = list(pipeline.text_pairs(src, tgt).as_numpy_iterator())
  assert got == [(b"a b", b"A B"), (b"d", b"D"), (b"e", b"E")]


@pytest.mark.parametrize("gz", [False, True])
def test_text_pairs_skip_lines(tmp_path, gz):
  pairs = [("a", "A"), ("b", "B"), ("", "C"), ("d", "D"), ("e", "E"), ("f", "F")]
  src, tgt = _write_pairs(tmp_path, "train", pairs, gz)
  got = list(pipeline.text_pairs(src, tgt, skip_lines=(4, 0, 2)).as_numpy_iterator())
  assert got == [(b"b", b"B"), (b"d", b"D"), (b"f", b"F")]
  got = list(pipeline.text_pairs(src, tgt, skip_lines=[5]).as_numpy_iterator())
  assert got == [(b"a", b"A"), (b"b", b"B"), (b"d", b"D"), (b"e", b"E")]


def test_text_pairs_skips_scanned_bad_lines(tmp_path):
  src = _write(tmp_path / "t.en", ["a", b"\xffb", "c"])
  tgt = _write(tmp_path / "t.de.gz", ["A", "B", "C"], gz=True)
  scan = corpora.scan_parallel(src, tgt, on_bad_line="skip")
  got = list(pipeline.text_pairs(src, tgt, skip_lines=scan.bad_lines).as_numpy_iterator())
  assert got == [(b"a", b"A"), (b"c", b"C")]


def test_text_pairs_agrees_with_read_parallel(tmp_path):
  pairs = _corpus(50, seed=2) + [("", "x"), ("y", " ")] + _corpus(10, seed=3)
  src, tgt = _write_pairs(tmp_path, "train", pairs, gz=True)
  got = [(s.decode(), t.decode())
         for s, t in pipeline.text_pairs(src, tgt, skip_lines=(3,)).as_numpy_iterator()]
  assert got == corpora.read_parallel(src, tgt, skip_lines=(3,))
  assert len(got) == 59


# ---------------------------------------------------------------- tokenize_pairs


def test_tokenize_pairs_appends_eos_and_filters(vocabulary):
  # > _TOKENIZE_BATCH pairs, so several tokenizer batches (and a partial one) are involved.
  pairs = _corpus(300, seed=4)
  source_ids, target_ids = _ids(vocabulary.source, [s for s, _ in pairs]), _ids(
      vocabulary.target, [t for _, t in pairs])
  lengths = sorted(max(len(s), len(t)) for s, t in zip(source_ids, target_ids))
  max_length = lengths[len(lengths) // 2]  # about half are dropped; some exactly at the limit
  assert lengths.count(max_length) >= 1 and lengths[-1] > max_length
  expected = [(s + [EOS_ID], t + [EOS_ID]) for s, t in zip(source_ids, target_ids)
              if len(s) <= max_length and len(t) <= max_length]
  assert 0 < len(expected) < len(pairs)

  dataset = _pairs_dataset(pairs).apply(pipeline.tokenize_pairs(vocabulary, max_length))
  assert dataset.element_spec == (tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([None], tf.int32))
  got = [(s.tolist(), t.tolist()) for s, t in dataset.as_numpy_iterator()]
  assert got == expected  # in order
  for s, t in got:
    assert len(s) <= max_length + 1 and len(t) <= max_length + 1
    assert PAD_ID not in s and PAD_ID not in t


def test_tokenize_pairs_boundary(vocabulary):
  text = "the cat sees the dog"
  n = len(_ids(vocabulary.source, [text])[0])
  short = "a"
  dataset = _pairs_dataset([(text, short), (short, text), (short, short)])
  kept = list(dataset.apply(pipeline.tokenize_pairs(vocabulary, n)).as_numpy_iterator())
  assert len(kept) == 3
  assert len(kept[0][0]) == n + 1 and kept[0][0][-1] == EOS_ID
  kept = list(dataset.apply(pipeline.tokenize_pairs(vocabulary, n - 1)).as_numpy_iterator())
  assert len(kept) == 1  # either side over the limit drops the pair


# ---------------------------------------------------------------- add_decoder_inputs


def test_add_decoder_inputs_by_hand():
  source = tf.constant([[11, 12, 3, 0, 0], [13, 3, 0, 0, 0]], tf.int32)
  target = tf.constant([[5, 6, 7, 3, 0], [8, 3, 0, 0, 0]], tf.int32)
  got_source, target_input, got_target = pipeline.add_decoder_inputs(source, target)
  np.testing.assert_array_equal(got_source, source)
  np.testing.assert_array_equal(got_target, target)
  np.testing.assert_array_equal(target_input, [[2, 5, 6, 7, 0], [2, 8, 0, 0, 0]])
  assert target_input.dtype == tf.int32


def test_add_decoder_inputs_full_row():
  target = tf.constant([[5, 6, 3]], tf.int32)
  _, target_input, _ = pipeline.add_decoder_inputs(target, target)
  np.testing.assert_array_equal(target_input, [[BOS_ID, 5, 6]])


# ---------------------------------------------------------------- eval / train batches


def _strip(row):
  row = list(row)
  while row and row[-1] == PAD_ID:
    row.pop()
  return tuple(row)


def _check_batch(source, target_input, target, boundaries, batch_tokens):
  assert source.shape == target_input.shape == target.shape
  batch, length = target.shape
  assert length in boundaries and batch * length <= batch_tokens
  shifted = np.concatenate([np.full([batch, 1], BOS_ID), target[:, :-1]], axis=1)
  np.testing.assert_array_equal(target_input, np.where(target == PAD_ID, PAD_ID, shifted))


def test_eval_batches_one_pass(vocabulary):
  pairs = _corpus(200, seed=5)
  max_length, batch_tokens = 20, 320
  source_ids, target_ids = _ids(vocabulary.source, [s for s, _ in pairs]), _ids(
      vocabulary.target, [t for _, t in pairs])
  expected = collections.Counter(
      (tuple(s + [EOS_ID]), tuple(t + [EOS_ID])) for s, t in zip(source_ids, target_ids)
      if len(s) <= max_length and len(t) <= max_length)
  assert 0 < sum(expected.values()) < len(pairs)
  boundaries = bucketing.bucket_boundaries(max_length + 1)

  dataset = pipeline.eval_batches(_pairs_dataset(pairs), vocabulary, max_length, batch_tokens)
  seen = collections.Counter()
  batches = list(dataset.as_numpy_iterator())
  for source, target_input, target in batches:
    _check_batch(source, target_input, target, boundaries, batch_tokens)
    for s, t in zip(source, target):
      seen[(_strip(s), _strip(t))] += 1
  assert seen == expected
  # A fixed order: a second pass gives the same batches.
  again = list(dataset.as_numpy_iterator())
  assert len(again) == len(batches)
  for a, b in zip(batches, again):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)


def _first_batches(pairs, vocabulary, seed, n=5):
  dataset = pipeline.train_batches(_pairs_dataset(pairs), vocabulary, max_length=30,
                                   batch_tokens=256, shuffle_buffer=500, seed=seed)
  return list(dataset.take(n).as_numpy_iterator())


def _same(batches_a, batches_b):
  return len(batches_a) == len(batches_b) and all(
      x.shape == y.shape and np.array_equal(x, y)
      for a, b in zip(batches_a, batches_b) for x, y in zip(a, b))


def test_train_batches_deterministic_per_seed(vocabulary):
  pairs = _corpus(150, seed=6)
  first = _first_batches(pairs, vocabulary, seed=7)
  assert len(first) == 5
  assert _same(first, _first_batches(pairs, vocabulary, seed=7))
  assert not _same(first, _first_batches(pairs, vocabulary, seed=8))


def test_train_batches_endless(vocabulary):
  pairs = _corpus(40, seed=9, max_words=8)
  max_length, batch_tokens = 30, 256
  boundaries = bucketing.bucket_boundaries(max_length + 1)
  dataset = pipeline.train_batches(_pairs_dataset(pairs), vocabulary, max_length, batch_tokens,
                                   shuffle_buffer=100, seed=1)
  assert dataset.element_spec == (tf.TensorSpec([None, None], tf.int32),) * 3
  examples = 0
  seen = collections.Counter()
  for source, target_input, target in dataset.take(60).as_numpy_iterator():
    _check_batch(source, target_input, target, boundaries, batch_tokens)
    examples += source.shape[0]
    for s, t in zip(source, target):
      seen[(_strip(s), _strip(t))] += 1
  assert examples > 3 * len(pairs)  # several epochs
  ids = zip(_ids(vocabulary.source, [s for s, _ in pairs]),
            _ids(vocabulary.target, [t for _, t in pairs]))
  assert set(seen) <= {(tuple(s + [EOS_ID]), tuple(t + [EOS_ID])) for s, t in ids}


# ---------------------------------------------------------------- count_examples


def test_count_examples(vocabulary):
  pairs = _corpus(120, seed=10)
  source_ids, target_ids = _ids(vocabulary.source, [s for s, _ in pairs]), _ids(
      vocabulary.target, [t for _, t in pairs])
  max_length = 15
  kept = sum(len(s) <= max_length and len(t) <= max_length
             for s, t in zip(source_ids, target_ids))
  assert 0 < kept < len(pairs)
  assert pipeline.count_examples(_pairs_dataset(pairs), vocabulary, max_length) == (
      kept, len(pairs) - kept)
  assert pipeline.count_examples(_pairs_dataset(pairs), vocabulary, 1000) == (len(pairs), 0)


# ---------------------------------------------------------------- ParallelData


def _config(data_dir, **kwargs):
  defaults = dict(data_dir=str(data_dir), vocab_size=100, max_length=60, batch_tokens=512,
                  shuffle_buffer=100, dev_prefix="val")
  defaults.update(kwargs)
  return DataConfig(**defaults)


@pytest.fixture
def data_dir(tmp_path):
  directory = tmp_path / "data"
  directory.mkdir()
  _write_pairs(directory, "train", _corpus(150, seed=11))
  _write_pairs(directory, "val", _corpus(20, seed=12), gz=True)
  return directory


def test_parallel_data_trains_then_reuses_model(data_dir, tmp_path):
  model_dir = str(tmp_path / "model")
  config = _config(data_dir)
  data = ParallelData(config, model_dir)
  model_path = os.path.join(model_dir, "spm.joint.model")
  assert os.path.isfile(model_path)
  assert data.vocabulary.source is data.vocabulary.target
  assert data.train_scan == corpora.CorpusScan(150, 0, ())
  assert data.dev_paths == (str(data_dir / "val.en.gz"), str(data_dir / "val.de.gz"))
  mtime = os.stat(model_path).st_mtime_ns
  size = data.vocabulary.source_size

  again = ParallelData(config, model_dir)
  assert os.stat(model_path).st_mtime_ns == mtime
  assert again.vocabulary.source_size == size
  assert sorted(os.listdir(model_dir)) == ["spm.joint.model"]

  dev_pairs = again.dev_pairs()
  assert len(dev_pairs) == 20 and len(again.dev_pairs(limit=3)) == 3
  dev_examples = sum(s.shape[0] for s, _, _ in again.dev_batches().as_numpy_iterator())
  assert dev_examples == 20
  source, target_input, target = next(iter(again.train_batches(seed=1)))
  assert source.shape[0] * source.shape[1] <= config.batch_tokens
  assert again.test_pairs() == []


def test_parallel_data_unshared(data_dir, tmp_path):
  model_dir = str(tmp_path / "model")
  data = ParallelData(_config(data_dir, shared_vocab=False, dev_prefix=None, test_prefix="val",
                              spm_model_type="bpe"), model_dir)
  assert sorted(os.listdir(model_dir)) == ["spm.de.model", "spm.en.model"]
  assert data.vocabulary.source is not data.vocabulary.target
  assert data.dev_batches() is None and data.dev_pairs() == []
  assert len(data.test_pairs()) == 20


def test_parallel_data_mismatched_train(data_dir, tmp_path):
  _write(data_dir / "train.de", [t for _, t in _corpus(151, seed=11)])
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
                          "check --data_dir and the prefixes")


def test_parallel_data_skips_bad_lines(data_dir, tmp_path):
  pairs = _corpus(150, seed=11)
  src = [s.encode() for s, _ in pairs]
  src[5] = b"\xff" + src[5]
  _write(data_dir / "train.en", src)
  with pytest.raises(corpora.CorpusError) as e:
    ParallelData(_config(data_dir), str(tmp_path / "model"))
  assert str(e.value) == (f"{data_dir}/train.en:6: not valid UTF-8 (byte 0xff at column 1); "
                          "fix the file or pass --on_bad_line=skip")
  data = ParallelData(_config(data_dir, on_bad_line="skip"), str(tmp_path / "model"))
  assert data.train_scan.bad_lines == (5,)
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
                          "(all empty, invalid or over --max_length=1)")


def test_config_is_frozen_dataclass(data_dir):
  config = _config(data_dir)
  assert dataclasses.replace(config, vocab_size=50).vocab_size == 50
