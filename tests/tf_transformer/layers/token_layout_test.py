"""Tests of tf_transformer/layers/token_layout.py: the moves between padded and token rows."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.layers.token_layout import TokenLayout

MASK = np.array([[True, True, True, False], [True, False, False, False],
                 [True, True, True, True]])


def test_rows_are_the_real_tokens_in_row_major_order():
  ids = np.array([[5, 6, 7, 0], [8, 0, 0, 0], [1, 2, 3, 4]], np.int32)
  layout = TokenLayout.of_ids(tf.constant(ids), 0)
  np.testing.assert_array_equal(layout.rows_of(tf.constant(ids)).numpy(), ids[MASK])
  np.testing.assert_array_equal(layout.positions.numpy(), [0, 1, 2, 0, 0, 1, 2, 3])
  assert layout.row_weights is None


def test_dense_layout_keeps_every_position_with_zero_weights_at_padding():
  ids = np.array([[5, 6, 0], [8, 0, 0]], np.int32)
  layout = TokenLayout.of_ids(tf.constant(ids), 0, skip_padding=False)
  np.testing.assert_array_equal(layout.rows_of(tf.constant(ids)).numpy(), ids.reshape(-1))
  np.testing.assert_array_equal(layout.positions.numpy(), [0, 1, 2, 0, 1, 2])
  np.testing.assert_array_equal(layout.row_weights.numpy(), [1, 1, 0, 1, 0, 0])


def test_to_padded_then_to_rows_gives_the_rows_back():
  layout = TokenLayout(tf.constant(MASK))
  rows = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  padded = layout.to_padded(tf.constant(rows)).numpy()
  assert padded.shape == (3, 4, 3)
  np.testing.assert_array_equal(padded[MASK], rows)
  assert np.all(np.isfinite(padded))  # filler, never garbage memory
  np.testing.assert_array_equal(layout.to_rows(tf.constant(padded)).numpy(), rows)


@pytest.mark.parametrize("skip_padding", [True, False])
def test_gradients_reach_real_tokens_only(skip_padding):
  """d/d rows of sum(w * to_rows(f(to_padded(rows)))) where f hides padded slots, against the
  same function written with a boolean mask (autodiff of plain gathers and scatters)."""
  mask = tf.constant(MASK)
  layout = TokenLayout(mask, skip_padding)
  rng = np.random.default_rng(0)
  count = int(MASK.sum()) if skip_padding else MASK.size
  rows = tf.constant(rng.normal(size=(count, 3)), tf.float32)
  mix = tf.constant(rng.normal(size=(3, 4, 4)), tf.float32)  # [B, T, T]: mixes positions
  weights = tf.constant(rng.normal(size=(int(MASK.sum()), 3)), tf.float32)
  keep = tf.cast(mask, tf.float32)

  def attend(padded):  # like attention: only real keys count, every query row is computed
    return tf.matmul(mix * keep[:, tf.newaxis, :], padded)

  with tf.GradientTape(persistent=True) as tape:
    tape.watch(rows)
    out = layout.to_rows(attend(layout.to_padded(rows)))
    real_out = tf.boolean_mask(tf.reshape(out, [3, 4, 3]), mask) if not skip_padding else out
    loss = tf.reduce_sum(real_out * weights)
  got = tape.gradient(loss, rows)

  with tf.GradientTape() as tape:
    tape.watch(rows)
    real_rows = rows if skip_padding else tf.boolean_mask(tf.reshape(rows, [3, 4, 3]), mask)
    padded = tf.scatter_nd(tf.where(mask), real_rows, [3, 4, 3])
    reference = tf.reduce_sum(tf.boolean_mask(attend(padded), mask) * weights)
  expected = tape.gradient(reference, rows)
  np.testing.assert_allclose(float(loss), float(reference), rtol=1e-6)
  np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-6)


@pytest.mark.parametrize("skip_padding", [True, False])
def test_an_empty_batch_moves_to_empty_shapes(skip_padding):
  """A replica's share of a batch may have no rows."""
  layout = TokenLayout(tf.zeros([0, 5], tf.bool), skip_padding)
  padded = layout.to_padded(tf.zeros([0, 3]))
  assert padded.shape == (0, 5, 3)
  assert layout.to_rows(padded).shape == (0, 3)
