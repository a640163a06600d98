"""Tests for data_pipeline.bucketing: length buckets with token-based batch sizes."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline import bucketing
from tests import testutil
from data_pipeline.token_ids import PAD_ID


# ---------------------------------------------------------------- boundaries


@pytest.mark.parametrize("max_length", [1, 2, 7, 8, 9, 12, 13, 50, 101, 256, 1000])
def test_bucket_boundaries_shape(max_length):
  boundaries = bucketing.bucket_boundaries(max_length)
  assert boundaries[0] == min(8, max_length)
  assert boundaries[-1] == max_length
  assert all(a < b for a, b in zip(boundaries, boundaries[1:]))
  assert all(isinstance(b, int) for b in boundaries)
  # All but the clipped last step are multiples of 4 (from 8).
  assert all((b - a) % 4 == 0 for a, b in zip(boundaries, boundaries[1:-1]))


def test_bucket_boundaries_values():
  assert bucketing.bucket_boundaries(5) == [5]
  assert bucketing.bucket_boundaries(8) == [8]
  assert bucketing.bucket_boundaries(10) == [8, 10]
  assert bucketing.bucket_boundaries(30) == [8, 12, 16, 20, 24, 28, 30]
  # Steps grow by ~10% of the boundary, rounded up to a multiple of 4.
  assert bucketing.bucket_boundaries(70) == [8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 52, 60, 68,
                                             70]


def test_bucket_boundaries_padding_bounded():
  # A long sentence is padded by at most ~10% (+ the multiple-of-4 rounding).
  boundaries = bucketing.bucket_boundaries(500)
  for previous, boundary in zip(boundaries, boundaries[1:]):
    assert boundary - previous <= max(4, 0.1 * previous + 4)


def test_bucket_batch_sizes():
  assert bucketing.bucket_batch_sizes([8, 12, 16, 100], 64) == [8, 5, 4, 1]
  assert bucketing.bucket_batch_sizes([8, 100], 50) == [6, 1]  # at least 1


# ---------------------------------------------------------------- bucket_by_length


def _random_pairs(num, max_length, seed):
  """`num` (source, target) int32 lists; source[0] = index + 4 identifies the example."""
  rng = np.random.default_rng(seed)
  pairs = []
  for index in range(num):
    source_length = int(rng.integers(1, max_length + 1))
    target_length = int(rng.integers(1, max_length + 1))
    source = [index + 4] + rng.integers(4, 1000, source_length - 1).tolist()
    target = rng.integers(4, 1000, target_length).tolist()  # never PAD_ID
    pairs.append((source, target))
  return pairs


def _dataset(pairs, width):
  """(source [width], target [width], length) rows as pipeline.tokenize_pairs makes them."""
  def gen():
    for source, target in pairs:
      rows = np.zeros([2, width], np.int32) + PAD_ID
      rows[0, :len(source)], rows[1, :len(target)] = source, target
      yield rows[0], rows[1], np.int32(max(len(source), len(target)))

  return tf.data.Dataset.from_generator(
      gen, output_signature=(tf.TensorSpec([width], tf.int32), tf.TensorSpec([width], tf.int32),
                             tf.TensorSpec([], tf.int32)))


@pytest.mark.parametrize("max_length,batch_tokens", [(50, 400), (100, 1000), (17, 64),
                                                     (6, 30)])
def test_bucketing_one_epoch(max_length, batch_tokens):
  """Every example exactly once, every batch within batch_tokens, every shape a boundary."""
  pairs = _random_pairs(500, max_length, seed=max_length)
  boundaries = bucketing.bucket_boundaries(max_length)
  sizes = dict(zip(boundaries, bucketing.bucket_batch_sizes(boundaries, batch_tokens)))
  batches = list(_dataset(pairs, max_length)
                 .apply(bucketing.bucket_by_length(max_length, batch_tokens))
                 .as_numpy_iterator())

  seen = collections.Counter()
  lengths_seen = set()
  for source, target in batches:
    assert source.dtype == np.int32 and target.dtype == np.int32
    assert source.ndim == 2 and source.shape == target.shape
    batch, length = source.shape
    assert length in boundaries
    assert 1 <= batch <= sizes[length]
    assert batch * length <= batch_tokens
    previous = max([b for b in boundaries if b < length], default=0)
    for source_row, target_row in zip(source, target):
      source_ids = testutil.strip_padding(source_row, PAD_ID)
      target_ids = testutil.strip_padding(target_row, PAD_ID)
      longest = max(len(source_ids), len(target_ids))
      assert previous < longest <= length  # the example belongs to this bucket
      seen[(source_ids, target_ids)] += 1
    lengths_seen.add(length)

  expected = collections.Counter((tuple(s), tuple(t)) for s, t in pairs)
  assert seen == expected
  assert sum(seen.values()) == len(pairs)
  assert len(lengths_seen) <= len(boundaries)
  # Only the last batch of each bucket may be partial.
  partial = collections.Counter(s.shape[1] for s, _ in batches if s.shape[0] < sizes[s.shape[1]])
  assert all(count == 1 for count in partial.values())


def test_bucketing_padding_values_and_order_within_bucket():
  pairs = [([5, 6], [7]), ([8], [9, 10, 11]), ([12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [22])]
  batches = list(_dataset(pairs, 12).apply(bucketing.bucket_by_length(12, 100))
                 .as_numpy_iterator())
  assert len(batches) == 2
  by_length = {s.shape[1]: (s, t) for s, t in batches}
  assert sorted(by_length) == [8, 12]
  source, target = by_length[8]
  np.testing.assert_array_equal(source, [[5, 6, 0, 0, 0, 0, 0, 0], [8, 0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(target, [[7, 0, 0, 0, 0, 0, 0, 0], [9, 10, 11, 0, 0, 0, 0, 0]])
  source, target = by_length[12]
  np.testing.assert_array_equal(source, [list(range(12, 22)) + [0, 0]])
  np.testing.assert_array_equal(target, [[22] + [0] * 11])


def test_bucketing_full_windows_emitted_in_stream():
  # 8 examples of length 1 with batch_tokens 32 -> batches of 4 at boundary 8.
  pairs = [([i + 4], [i + 4]) for i in range(8)]
  batches = list(_dataset(pairs, 8).apply(bucketing.bucket_by_length(8, 32))
                 .as_numpy_iterator())
  assert [s.shape for s, _ in batches] == [(4, 8), (4, 8)]
  assert [int(s[0, 0]) for s, _ in batches] == [4, 8]


def test_bucketing_example_at_max_length():
  pairs = [(list(range(4, 4 + 13)), [5])]
  batches = list(_dataset(pairs, 13).apply(bucketing.bucket_by_length(13, 100))
                 .as_numpy_iterator())
  assert len(batches) == 1
  assert batches[0][0].shape == (1, 13)
