"""Tests of tf_transformer/layers/precisions.py: the int8 and bfloat16 products against exact
float64 references, the float32 kernel against the products as trained, and the conversion of a
whole Transformer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import config
from tf_transformer.config import ModelConfig
from tf_transformer.layers import precisions
from tf_transformer.model import build_model


def _bfloat16(x):
  """float32 -> the nearest bfloat16 (round half to even), as float64: by hand on the bits."""
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
  return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def test_int8_product_is_exact_on_the_int8_grid():
  # every row and every kernel column reaches +-127, so both scales are 1: nothing is rounded
  rng = np.random.default_rng(0)
  rows = rng.integers(-127, 128, size=(5, 64)).astype(np.float32)
  rows[:, 0] = [127, -127, 127, -127, 127]
  kernel = rng.integers(-127, 128, size=(64, 24)).astype(np.float32)
  kernel[3] = 127
  low = precisions.Int8Kernel.from_matrix(kernel, "k")
  assert low.values.dtype == tf.int8 and low.scale.shape == (1, 24)
  np.testing.assert_array_equal(low.matmul(tf.constant(rows)).numpy(),
                                rows.astype(np.float64) @ kernel.astype(np.float64))


def test_int8_product_of_one_static_row_under_xla_keeps_the_kernel_in_int8():
  """A greedy decoding step at batch 1 multiplies one row, for which XLA's CPU backend would
  widen the kernel to int32: the optimized HLO of the CPU (whatever device the test machine
  prefers) multiplies the int8 kernel, not an int32 copy of it."""
  with tf.device("/CPU:0"):
    rng = np.random.default_rng(3)
    low = precisions.Int8Kernel.from_matrix(rng.normal(size=(64, 24)).astype(np.float32), "k")
    rows = tf.constant(rng.normal(size=(3, 64)).astype(np.float32))
    product = tf.function(lambda r: low.matmul(r, static_rows=True), jit_compile=True)
    hlo = product.experimental_get_compiler_ir(rows[:1])(stage="optimized_hlo")
    assert "s8[64,24]" in hlo and "s32[64,24]" not in hlo
    expected = low.matmul(rows).numpy()  # 3 rows: no padding on either path
    np.testing.assert_array_equal(product(rows[:1]).numpy(), expected[:1])
    np.testing.assert_array_equal(product(rows).numpy(), expected)
    np.testing.assert_array_equal(low.matmul(rows[:1], static_rows=True).numpy(),
                                  expected[:1])


def test_int8_product_error_within_the_rounding_bound():
  rng = np.random.default_rng(1)
  rows = rng.normal(size=(8, 256)).astype(np.float32)
  kernel = rng.normal(scale=0.05, size=(256, 1024)).astype(np.float32)
  out = precisions.Int8Kernel.from_matrix(kernel, "k").matmul(tf.constant(rows)).numpy()
  exact = rows.astype(np.float64) @ kernel.astype(np.float64)
  # each factor is off by at most half a step (max / 254) per element
  row_step = np.abs(rows).max(axis=1, keepdims=True) / 254
  column_step = np.abs(kernel).max(axis=0, keepdims=True) / 254
  bound = (row_step * np.abs(kernel).sum(axis=0) + np.abs(rows).sum(axis=1, keepdims=True)
           * column_step + row_step * column_step * 256)
  assert (np.abs(out - exact) <= bound * (1 + 1e-5)).all()
  # and far inside it on average: the rounding errors are independent and cancel. Expected
  # here: each product term is off by about step / sqrt(12) times the other factor, so the
  # error is about 1% of the result (rows ~ N(0, 1), max ~3.5: steps of 1/36; kernel ~ N(0,
  # 0.05^2): steps of 1/730), the same relative error whatever d_in
  assert np.abs(out - exact).mean() < 0.1 * bound.mean()
  assert np.abs(out - exact).mean() < 0.015 * np.abs(exact).mean()


def test_bfloat16_product_rounds_the_kernel_to_8_significant_bits():
  rng = np.random.default_rng(2)
  kernel = rng.normal(size=(32, 16)).astype(np.float32)
  low = precisions.Bfloat16Kernel.from_matrix(kernel, "k")
  assert low.values.dtype == tf.bfloat16 and low.scale is None
  picks = np.eye(32, dtype=np.float32)[:6]  # rows that pick kernel rows: nothing else rounds
  np.testing.assert_array_equal(low.matmul(tf.constant(picks)).numpy(), _bfloat16(kernel[:6]))
  rows = rng.normal(size=(6, 32)).astype(np.float32)
  exact = rows.astype(np.float64) @ kernel.astype(np.float64)
  out = low.matmul(tf.constant(rows)).numpy()
  # both factors and the result rounded to 8 bits: 3 relative errors of at most 2**-9 each
  bound = 3 * 2.0**-9 * (np.abs(rows) @ np.abs(kernel)) * (1 + 1e-3)
  assert (np.abs(out - exact) <= bound).all() and np.abs(out - exact).max() > 0


def test_matmul_adds_the_bias_and_applies_relu_in_float32():
  kernel = np.array([[1.0, -2.0], [0.5, 0.25]], np.float32)
  low = precisions.Bfloat16Kernel.from_matrix(kernel, "k")
  out = low.matmul(tf.constant([[2.0, 4.0]]), bias=tf.constant([-1.0, 1.0]), relu=True)
  np.testing.assert_array_equal(out.numpy(), [[3.0, 0.0]])  # [4 - 1, -4 + 1 + 1 -> 0]


def test_unknown_precision_is_refused_and_the_registry_is_the_flags_choices():
  with pytest.raises(ValueError, match="precision must be one of"):
    precisions.convert(None, "int4")
  assert tuple(precisions.PRECISIONS) == config.CHOICES["precision"]
  assert all(issubclass(kind, precisions.Kernel) for kind in precisions.PRECISIONS.values())


def _model(seed=0, **options):
  """A random 2-layer model; with `options` (config.ModelConfig's), random biases too."""
  keras.utils.set_random_seed(seed)
  model = build_model(ModelConfig(50, 50, num_layers=2, d_model=32, num_heads=4, d_ff=64,
                                  **options))
  rng = np.random.default_rng(seed)
  for variable in model.weights if options else ():
    if "bias" in variable.path:
      variable.assign(rng.normal(scale=0.5, size=variable.shape).astype(np.float32))
  return model


# a Marian model's options: biases on the attention projections and the logits, swish
MARIAN = dict(activation="swish", projection_biases=True, layer_norm_epsilon=1e-5,
              output_bias=True, sinusoid_layout="halves", scale_embeddings=False)


@pytest.mark.parametrize("options", [{}, MARIAN], ids=["paper", "marian"])
@pytest.mark.parametrize("precision, tolerance", [("int8", 0.03), ("bfloat16", 0.03)])
def test_converted_model_reads_only_the_copies(precision, tolerance, options):
  reference, model = _model(**options), _model(**options)
  ids = tf.constant(np.random.default_rng(3).integers(4, 50, size=(3, 9)), tf.int32)
  source, target = ids, tf.roll(ids, 1, axis=1)
  expected = reference((source, target), training=False).numpy()
  added, replaced = precisions.convert(model, precision)
  # per layer: self-attention qkv and output, feed-forward inner and outer (encoder); and the
  # cross-attention q, kv and output (decoder); plus the pre-softmax copy
  assert len(replaced) == 2 * 4 + 2 * 7
  assert len(added) == (len(replaced) + 1) * (2 if precision == "int8" else 1)
  out = model((source, target), training=False).numpy()
  assert np.abs(out - expected).max() < tolerance * np.abs(expected).max()
  assert np.abs(out - expected).max() > 0  # the copies, not the float32 matrices, were used
  for variable in replaced:  # the float32 matrices are no longer read at all
    variable.assign(tf.fill(variable.shape, np.nan))
  np.testing.assert_array_equal(model((source, target), training=False).numpy(), out)


def test_float32_converts_nothing():
  model = _model()
  assert precisions.convert(model, "float32") == ([], [])
  assert all(isinstance(kernel, precisions.Float32Kernel)
             for kernel in model.decoder.layer_0.ffn.kernels.values())


@pytest.mark.parametrize("precision", ["float32", "int8", "bfloat16"])
def test_output_kernel_of_some_ids_gives_those_logits(precision):
  """Shortlists' kernel (SharedEmbedding.output_kernel(ids)): each sentence's rows (3 each, an
  odd count: int8 pads them) get the columns of its own ids, int8 scales gathered with their
  columns; a bias of each sentence's ids is added to its rows."""
  keras.utils.set_random_seed(4)
  model = build_model(ModelConfig(40, 40, num_layers=1, d_model=16, num_heads=2, d_ff=32))
  precisions.convert(model, precision)
  hidden = tf.constant(np.random.default_rng(3).normal(size=(6, 16)), tf.float32)
  ids = np.array([[3, 37, 0, 21, 8, 9], [5, 6, 7, 1, 2, 39]])
  bias = np.random.default_rng(4).normal(size=(2, 6)).astype(np.float32)
  full = model.logits(hidden).numpy()
  listed = model.logits(hidden, model.target_embedding.output_kernel(tf.constant(ids)),
                        tf.constant(bias))
  assert listed.shape == (6, 6)
  expected = np.concatenate([full[:3, ids[0]] + bias[0], full[3:, ids[1]] + bias[1]])
  if precision == "int8":  # int32 sums and per-column scales: exactly those columns
    np.testing.assert_array_equal(listed.numpy(), expected)
  else:
    np.testing.assert_allclose(listed.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["float32_fast", "float32", "int8", "bfloat16"])
def test_every_kernel_forms_relu_of_scaled_product_plus_bias(kind):
  """One contract for every precision: max(0, (rows @ kernel) * column_scale + bias), against
  float64, within each precision's rounding (float32: 1e-6)."""
  rng = np.random.default_rng(5)
  kernel = rng.normal(size=(16, 12)).astype(np.float32)
  rows = rng.normal(size=(5, 16)).astype(np.float32)
  bias, scale = rng.normal(size=12).astype(np.float32), rng.uniform(0.5, 2, 12).astype(np.float32)
  if kind.startswith("float32"):
    made = precisions.Float32Kernel(tf.Variable(kernel), fast_input_gradient=kind != "float32")
  else:
    made = precisions.PRECISIONS[kind].from_matrix(kernel, "k")
  out = made.matmul(tf.constant(rows), bias=tf.constant(bias), relu=True,
                    column_scale=tf.constant(scale)).numpy()
  exact = np.maximum(0, (rows.astype(np.float64) @ kernel) * scale + bias)
  tolerance = {"int8": 0.03, "bfloat16": 0.02}.get(kind, 1e-6)
  assert np.abs(out - exact).max() <= tolerance * np.abs(exact).max()
  assert (out[exact == 0] == 0).all() or kind in ("int8", "bfloat16")


def test_the_float32_output_kernel_is_the_transposed_embedding_and_its_columns():
  embeddings = np.random.default_rng(6).normal(size=(10, 4)).astype(np.float32)
  kernel = precisions.Float32Kernel(tf.Variable(embeddings), transposed=True)
  assert kernel.shape == (4, 10)
  np.testing.assert_array_equal(kernel.column_tensors()[0].numpy(), embeddings.T)
  np.testing.assert_array_equal(kernel.column_tensors(tf.constant([[7, 2], [1, 9]]))[0].numpy(),
                                [embeddings[[7, 2]].T, embeddings[[1, 9]].T])
  assert kernel.column_tensors(dtype=tf.bfloat16)[0].dtype == tf.bfloat16
