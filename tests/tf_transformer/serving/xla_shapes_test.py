"""The XLA shape buckets of tf_transformer/serving/xla_shapes.py, worked by hand."""

import pytest
import tensorflow as tf

from data_pipeline.token_ids import PAD_ID
from tf_transformer.serving import xla_shapes


@pytest.mark.parametrize("max_length, ladder", [
    (14, (16,)), (32, (16, 32, 48)), (100, (16, 32, 64, 112)), (256, (16, 32, 64, 128, 256, 272)),
])
def test_the_width_ladder_doubles_up_to_the_widest_bucket(max_length, ladder):
  assert xla_shapes.width_ladder(max_length) == ladder


def test_a_source_is_padded_to_the_next_width_of_the_ladder():
  ladder = xla_shapes.width_ladder(100)
  for width, padded in ((1, 16), (16, 16), (17, 32), (33, 64), (64, 64), (65, 112), (101, 112)):
    ids = tf.ones([2, width], tf.int32)
    out = xla_shapes.bucketed(ids, 2, ladder)
    assert out.shape == (4, padded), width
    assert tf.reduce_all(out[:, width:] == PAD_ID) and tf.reduce_all(out[:, :width] == 1)
  assert xla_shapes.bucketed(tf.ones([1, 17], tf.int32), 0).shape == (1, 32)  # no ladder: 16s


@pytest.mark.parametrize("allowed, chunk, rows", [
    ((1, 2, 4), 64, (1, 2, 4)), ((1, 2, 4, 8, 16, 32), 64, (1, 2, 4, 8, 16, 32)),
    ((1, 3, 100), 64, (1, 4, 64)),  # 3 rows run as 4; 100 as chunks of 64 and 36 (-> 64)
])
def test_compiled_rows_are_the_row_buckets_of_the_allowed_sizes_in_chunks(allowed, chunk, rows):
  assert xla_shapes.compiled_rows(allowed, chunk) == rows


def test_a_shape_is_compiled_at_a_warmed_row_count_narrow_prefix_and_constraints():
  from tf_transformer.decoding.lexical_constraints import Constraints

  def covered(rows, prefix_width=None, constraint_width=None):
    source = tf.ones([rows, 5], tf.int32)
    prefix = None if prefix_width is None else tf.ones([rows, prefix_width], tf.int32)
    constraints = None if constraint_width is None else Constraints(
        tf.ones([rows, constraint_width], tf.int32), tf.zeros([rows, constraint_width], tf.bool),
        tf.ones([rows, 1, constraint_width], tf.int32))
    return bool(xla_shapes.at_compiled_shape(source, prefix, constraints, (1, 2, 4), 32))

  assert covered(1) and covered(3) and covered(4) and not covered(5) and not covered(8)
  assert covered(2, prefix_width=0) and covered(2, prefix_width=16)
  assert not covered(2, prefix_width=17)
  assert covered(2, constraint_width=8) and not covered(2, constraint_width=9)
