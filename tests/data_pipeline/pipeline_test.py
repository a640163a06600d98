"""Tests of data_pipeline/pipeline.py: text -> ids -> bucketed batches, streamed."""

import collections
import json

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline import bucketing, corpora, pipeline, tokenizer
from data_pipeline.token_ids import BOS_ID, EOS_ID, PAD_ID
from tests import testutil

def _pairs_dataset(pairs):
  return tf.data.Dataset.from_tensor_slices(
      ([s for s, _ in pairs], [t for _, t in pairs]))


def _ids(tok, texts):
  return tok.tokenize(tf.constant(texts)).to_list()


# ---------------------------------------------------------------- text_pairs


@pytest.mark.parametrize("gz", [False, True])
def test_text_pairs_drops_empty_pairs(tmp_path, gz):
  pairs = [(" a b ", "A B"), ("", "x"), ("c", "  "), ("d\t", " D"), ("   ", ""), ("e", "E")]
  src, tgt = testutil.write_pairs(tmp_path, "train", pairs, gz)
  got = list(pipeline.text_pairs(src, tgt).as_numpy_iterator())
  assert got == [(b"a b", b"A B"), (b"d", b"D"), (b"e", b"E")]


@pytest.mark.parametrize("gz", [False, True])
def test_text_pairs_skip_lines(tmp_path, gz):
  pairs = [("a", "A"), ("b", "B"), ("", "C"), ("d", "D"), ("e", "E"), ("f", "F")]
  src, tgt = testutil.write_pairs(tmp_path, "train", pairs, gz)
  got = list(pipeline.text_pairs(src, tgt, skip_lines=(4, 0, 2)).as_numpy_iterator())
  assert got == [(b"b", b"B"), (b"d", b"D"), (b"f", b"F")]
  got = list(pipeline.text_pairs(src, tgt, skip_lines=[5]).as_numpy_iterator())
  assert got == [(b"a", b"A"), (b"b", b"B"), (b"d", b"D"), (b"e", b"E")]


def test_text_pairs_skips_scanned_bad_lines(tmp_path):
  src = testutil.write_lines(tmp_path / "t.en", ["a", b"\xffb", "c"])
  tgt = testutil.write_lines(tmp_path / "t.de.gz", ["A", "B", "C"])
  scan = corpora.scan_parallel(src, tgt, on_bad_line="skip")
  got = list(pipeline.text_pairs(src, tgt, skip_lines=scan.bad_lines).as_numpy_iterator())
  assert got == [(b"a", b"A"), (b"c", b"C")]


def test_text_pairs_agrees_with_read_parallel(tmp_path):
  pairs = (testutil.sentence_pairs(50, seed=2) + [("", "x"), ("y", " ")] +
           testutil.sentence_pairs(10, seed=3))
  src, tgt = testutil.write_pairs(tmp_path, "train", pairs, gz=True)
  got = [(s.decode(), t.decode())
         for s, t in pipeline.text_pairs(src, tgt, skip_lines=(3,)).as_numpy_iterator()]
  assert got == corpora.read_parallel(src, tgt, skip_lines=(3,))
  assert len(got) == 59


# ---------------------------------------------------------------- tokenize_pairs


def test_tokenize_pairs_appends_eos_and_filters(vocabulary):
  # > _TOKENIZE_BATCH pairs, so several tokenizer batches (and a partial one) are involved.
  pairs = testutil.sentence_pairs(300, seed=4)
  source_ids, target_ids = _ids(vocabulary.source, [s for s, _ in pairs]), _ids(
      vocabulary.target, [t for _, t in pairs])
  lengths = sorted(max(len(s), len(t)) for s, t in zip(source_ids, target_ids))
  max_length = lengths[len(lengths) // 2]  # about half are dropped; some exactly at the limit
  assert lengths.count(max_length) >= 1 and lengths[-1] > max_length
  expected = [(s + [EOS_ID], t + [EOS_ID]) for s, t in zip(source_ids, target_ids)
              if len(s) <= max_length and len(t) <= max_length]
  assert 0 < len(expected) < len(pairs)

  dataset = _pairs_dataset(pairs).apply(pipeline.tokenize_pairs(vocabulary, max_length))
  width = max_length + 1
  assert dataset.element_spec == (tf.TensorSpec([width], tf.int32),
                                  tf.TensorSpec([width], tf.int32), tf.TensorSpec([], tf.int32))
  got = []
  for source, target, length in dataset.as_numpy_iterator():
    # each side is its ids and EOS, then PAD_ID to the width; length is the longer side's
    unpadded = testutil.strip_padding(source, PAD_ID), testutil.strip_padding(target, PAD_ID)
    assert PAD_ID not in unpadded[0] and PAD_ID not in unpadded[1]
    assert length == max(map(len, unpadded))
    got.append(tuple(map(list, unpadded)))
  assert got == expected  # in order


def test_tokenize_pairs_boundary(vocabulary):
  text = "the cat sees the dog"
  n = len(_ids(vocabulary.source, [text])[0])
  short = "a"
  dataset = _pairs_dataset([(text, short), (short, text), (short, short)])
  kept = list(dataset.apply(pipeline.tokenize_pairs(vocabulary, n)).as_numpy_iterator())
  assert len(kept) == 3
  assert kept[0][0][-1] == EOS_ID and kept[0][2] == n + 1  # a full row: no padding at all
  kept = list(dataset.apply(pipeline.tokenize_pairs(vocabulary, n - 1)).as_numpy_iterator())
  assert len(kept) == 1  # either side over the limit drops the pair


# ---------------------------------------------------------------- eval / train batches


def _check_batch(source, target_input, target, boundaries, batch_tokens):
  assert source.shape == target_input.shape == target.shape
  batch, length = target.shape
  assert length in boundaries and batch * length <= batch_tokens
  shifted = np.concatenate([np.full([batch, 1], BOS_ID), target[:, :-1]], axis=1)
  np.testing.assert_array_equal(target_input, np.where(target == PAD_ID, PAD_ID, shifted))


def test_eval_batches_one_pass(vocabulary):
  pairs = testutil.sentence_pairs(200, seed=5)
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
      seen[(testutil.strip_padding(s, PAD_ID), testutil.strip_padding(t, PAD_ID))] += 1
  assert seen == expected
  # A fixed order: a second pass gives the same batches.
  again = list(dataset.as_numpy_iterator())
  assert len(again) == len(batches)
  for a, b in zip(batches, again):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)


def _first_batches(pairs, vocabulary, seed, n=5):
  dataset = pipeline.train_batches([(_pairs_dataset(pairs), 500)], vocabulary, max_length=30,
                                   batch_tokens=256, seed=seed)
  return list(dataset.take(n).as_numpy_iterator())


def _same(batches_a, batches_b):
  return len(batches_a) == len(batches_b) and all(
      x.shape == y.shape and np.array_equal(x, y)
      for a, b in zip(batches_a, batches_b) for x, y in zip(a, b))


def test_train_batches_deterministic_per_seed(vocabulary):
  pairs = testutil.sentence_pairs(150, seed=6)
  first = _first_batches(pairs, vocabulary, seed=7)
  assert len(first) == 5
  assert _same(first, _first_batches(pairs, vocabulary, seed=7))
  assert not _same(first, _first_batches(pairs, vocabulary, seed=8))


def test_train_batches_endless(vocabulary):
  pairs = testutil.sentence_pairs(40, seed=9, max_words=8)
  max_length, batch_tokens = 30, 256
  boundaries = bucketing.bucket_boundaries(max_length + 1)
  dataset = pipeline.train_batches([(_pairs_dataset(pairs), 100)], vocabulary, max_length,
                                   batch_tokens, seed=1)
  assert dataset.element_spec == (tf.TensorSpec([None, None], tf.int32),) * 3
  examples = 0
  seen = collections.Counter()
  for source, target_input, target in dataset.take(60).as_numpy_iterator():
    _check_batch(source, target_input, target, boundaries, batch_tokens)
    examples += source.shape[0]
    for s, t in zip(source, target):
      seen[(testutil.strip_padding(s, PAD_ID), testutil.strip_padding(t, PAD_ID))] += 1
  assert examples > 3 * len(pairs)  # several epochs
  ids = zip(_ids(vocabulary.source, [s for s, _ in pairs]),
            _ids(vocabulary.target, [t for _, t in pairs]))
  assert set(seen) <= {(tuple(s + [EOS_ID]), tuple(t + [EOS_ID])) for s, t in ids}


# ---------------------------------------------------------------- count_examples


def test_count_examples(vocabulary):
  pairs = testutil.sentence_pairs(120, seed=10)
  source_ids, target_ids = _ids(vocabulary.source, [s for s, _ in pairs]), _ids(
      vocabulary.target, [t for _, t in pairs])
  max_length = 15
  kept = sum(len(s) <= max_length and len(t) <= max_length
             for s, t in zip(source_ids, target_ids))
  assert 0 < kept < len(pairs)
  assert pipeline.count_examples(_pairs_dataset(pairs), vocabulary, max_length) == (
      kept, len(pairs) - kept)
  assert pipeline.count_examples(_pairs_dataset(pairs), vocabulary, 1000) == (len(pairs), 0)


# ---------------------------------------------------------------- memory: the pipeline streams


_ONE_PASS = """
import json, resource, sys
from data_pipeline import pipeline, tokenizer

def rss_mib():
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

lines, folder, spm = int(sys.argv[1]), sys.argv[2], sys.argv[3]
vocabulary = tokenizer.load_vocabulary(spm, spm)
pairs = pipeline.text_pairs(f"{folder}/train.src", f"{folder}/train.tgt")
batches = pipeline.train_batches([(pairs, 10_000)], vocabulary, max_length=64,
                                 batch_tokens=4096, seed=1)
seen, rss = 0, {}
for source_ids, _, _ in batches:
  seen += int(source_ids.shape[0])
  if seen >= lines // 10 and "tenth" not in rss:
    rss["tenth"] = rss_mib()
  if seen >= lines:
    break
print(json.dumps({"seen": seen, "rss_tenth_mib": rss["tenth"], "rss_end_mib": rss_mib(),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _write_random_corpus(folder, lines):
  """train.src/train.tgt: `lines` random sentences of 1-4 words of 500 on each side."""
  rng = np.random.default_rng(0)
  words = np.array([f"w{i}" for i in range(500)])
  sides = []
  for _ in range(2):
    lengths = rng.integers(1, 5, lines)
    tokens = rng.choice(words, int(lengths.sum()))
    ends = np.cumsum(lengths)
    sides.append([" ".join(tokens[end - n:end]) for n, end in zip(lengths, ends)])
  testutil.write_corpus(folder, "train", *sides)


def test_rss_stays_flat_over_a_million_line_corpus(tmp_path):
  lines = 1_000_000
  _write_random_corpus(tmp_path, lines)
  spm = str(tmp_path / "spm.model")
  with open(tmp_path / "train.src") as f:
    tokenizer.train_sentencepiece((next(f) for _ in range(5000)), spm, 300)
  result = testutil.run_python(_ONE_PASS, str(lines), str(tmp_path), spm, timeout=600)
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  print(f"one pass over {lines} pairs: {report}")  # shown with pytest -s
  assert report["seen"] >= lines
  # from a tenth of the corpus to all of it, the process grows by less than 100 MiB
  assert report["rss_end_mib"] < report["rss_tenth_mib"] + 100, report
