"""Tests of tf_transformer/layers/attention.py against a float64 numpy reference."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer.layers import attention_bias
from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.token_layout import TokenLayout

D_MODEL = 16


def _rows(x, mask=None):
  """x [B, T, d] -> (rows, TokenLayout): the real positions' rows when `mask` (bool [B, T]) is
  given, every position's otherwise."""
  x = tf.constant(x, tf.float32)
  if mask is None:
    return tf.reshape(x, [-1, D_MODEL]), TokenLayout.dense(x.shape[0], x.shape[1])
  return tf.boolean_mask(x, mask), TokenLayout(tf.constant(mask))


def _attend(layer, x, bias, mask=None, memory=None, memory_mask=None, **kwargs):
  """`layer` over query x [B, T, d] (and memory [B, S, d]) -> (output numpy [B, T, d], zeros
  at the positions `mask` leaves out; the returned cache)."""
  rows, layout = _rows(x, mask)
  if memory is not None:
    kwargs["memory"], kwargs["memory_layout"] = _rows(memory, memory_mask)
  out, cache = layer(rows, bias, layout=layout, **kwargs)
  return layout.to_padded(out).numpy() * (1 if mask is None else mask[..., None]), cache


def _split_heads(x, num_heads):
  """[B, T, d] -> [B, H, T, d/H], heads taking contiguous column blocks."""
  b, t, d = x.shape
  return x.reshape(b, t, num_heads, d // num_heads).transpose(0, 2, 1, 3)


def _reference(query, memory, q_w, k_w, v_w, out_w, bias, num_heads, biases=(0, 0, 0, 0)):
  """Multi-head attention in float64; `biases`: of the query, key, value and output
  projections (Marian's, scaled with the query)."""
  q_b, k_b, v_b, out_b = biases
  q = _split_heads(query @ q_w + q_b, num_heads)
  k = _split_heads(memory @ k_w + k_b, num_heads)
  v = _split_heads(memory @ v_w + v_b, num_heads)
  depth = q.shape[-1]
  logits = q @ k.transpose(0, 1, 3, 2) * depth**-0.5 + bias
  context = testutil.softmax(logits) @ v  # [B, H, T, D]
  b, h, t, dd = context.shape
  context = context.transpose(0, 2, 1, 3).reshape(b, t, h * dd)
  return context @ out_w + out_b


def _self_layer(num_heads, seed=0):
  keras.utils.set_random_seed(seed)
  layer = MultiHeadAttention(num_heads, 0.0, self_attention=True)
  layer.build((None, None, D_MODEL))
  return layer


def _cross_layer(num_heads, seed=0):
  keras.utils.set_random_seed(seed)
  layer = MultiHeadAttention(num_heads, 0.0, self_attention=False)
  layer.build((None, None, D_MODEL), (None, None, D_MODEL))
  return layer


def _self_weights(layer):
  qkv = layer.qkv_kernel.numpy().astype(np.float64)
  d = D_MODEL
  return qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:], layer.output_kernel.numpy().astype(
      np.float64)


@pytest.mark.parametrize("real_rows_only", [False, True])
@pytest.mark.parametrize("num_heads", [2, 4])
def test_self_attention_matches_numpy_reference(num_heads, real_rows_only):
  layer = _self_layer(num_heads)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 5, D_MODEL)).astype(np.float32)
  ids = tf.constant([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]], tf.int32)
  real = ids.numpy() != 0
  bias = attention_bias.padding_bias(ids)
  out, _ = _attend(layer, x, bias, real if real_rows_only else None, training=False)
  q_w, k_w, v_w, o_w = _self_weights(layer)
  ref = _reference(x.astype(np.float64), x.astype(np.float64), q_w, k_w, v_w, o_w,
                   bias.numpy().astype(np.float64), num_heads)
  assert out.shape == (2, 5, D_MODEL)
  np.testing.assert_allclose(out[real], ref[real], atol=1e-5)


def test_self_attention_with_causal_bias_matches_reference():
  num_heads = 2
  layer = _self_layer(num_heads, seed=3)
  x = np.random.default_rng(3).normal(size=(1, 4, D_MODEL)).astype(np.float32)
  bias = attention_bias.causal_bias(4)
  out, _ = _attend(layer, x, bias, training=False)
  ref = _reference(x.astype(np.float64), x.astype(np.float64), *_self_weights(layer),
                   bias.numpy().astype(np.float64), num_heads)
  np.testing.assert_allclose(out, ref, atol=1e-5)
  # query 0 attends to key 0 only: output = v_0 @ W_o
  q_w, k_w, v_w, o_w = _self_weights(layer)
  np.testing.assert_allclose(out[0, 0], x[0, 0].astype(np.float64) @ v_w @ o_w, atol=1e-5)


def test_masked_keys_do_not_affect_output():
  layer = _self_layer(2)
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 6, D_MODEL)).astype(np.float32)
  ids = tf.constant([[3, 4, 5, 0, 0, 0], [8, 9, 10, 11, 0, 0]], tf.int32)
  bias = attention_bias.padding_bias(ids)
  changed = x.copy()
  changed[0, 3:] = rng.normal(size=(3, D_MODEL)) * 10.0
  changed[1, 4:] = rng.normal(size=(2, D_MODEL)) * 10.0
  out, _ = _attend(layer, x, bias, training=False)
  out_changed, _ = _attend(layer, changed, bias, training=False)
  real = ids.numpy() != 0
  np.testing.assert_allclose(out_changed[real], out[real], atol=1e-6)


@pytest.mark.parametrize("real_rows_only", [False, True])
@pytest.mark.parametrize("num_heads", [2, 4])
def test_cross_attention_matches_reference_and_ignores_masked_memory(num_heads, real_rows_only):
  layer = _cross_layer(num_heads, seed=5)
  rng = np.random.default_rng(5)
  query = rng.normal(size=(2, 3, D_MODEL)).astype(np.float32)
  memory = rng.normal(size=(2, 5, D_MODEL)).astype(np.float32)
  source_ids = tf.constant([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]], tf.int32)
  memory_mask = source_ids.numpy() != 0 if real_rows_only else None
  bias = attention_bias.padding_bias(source_ids)
  out, _ = _attend(layer, query, bias, memory=memory, memory_mask=memory_mask, training=False)
  kv = layer.kv_kernel.numpy().astype(np.float64)
  ref = _reference(query.astype(np.float64), memory.astype(np.float64),
                   layer.q_kernel.numpy().astype(np.float64), kv[:, :D_MODEL],
                   kv[:, D_MODEL:], layer.output_kernel.numpy().astype(np.float64),
                   bias.numpy().astype(np.float64), num_heads)
  assert out.shape == (2, 3, D_MODEL)
  np.testing.assert_allclose(out, ref, atol=1e-5)

  changed = memory.copy()
  changed[0, 3:] = 100.0
  out_changed, _ = _attend(layer, query, bias, memory=changed, memory_mask=memory_mask,
                           training=False)
  np.testing.assert_allclose(out_changed, out, atol=1e-6)

  # projected memory used as a cache gives the same result
  cached, _ = _attend(layer, query, bias, cache=layer.project_memory(tf.constant(memory)),
                      training=False)
  np.testing.assert_allclose(cached, out, atol=1e-6)


@pytest.mark.parametrize("self_attention", [True, False])
def test_projection_biases_match_the_reference_in_full_and_cached_passes(self_attention):
  """With use_bias, every projection adds its bias (the query's before its scaling); a
  decoding step's cached pass gives the full pass's output."""
  keras.utils.set_random_seed(3)
  layer = MultiHeadAttention(2, 0.0, self_attention=self_attention, use_bias=True)
  layer.build((None, None, D_MODEL), None if self_attention else (None, None, D_MODEL))
  rng = np.random.default_rng(3)
  for bias in layer.biases.values():
    bias.assign(rng.normal(size=bias.shape).astype(np.float32))
  query = rng.normal(size=(2, 3, D_MODEL)).astype(np.float32)
  memory = query if self_attention else rng.normal(size=(2, 4, D_MODEL)).astype(np.float32)
  if self_attention:
    names, ids = ("qkv_kernel",), tf.constant([[1, 2, 3], [4, 5, 0]])
    bias = attention_bias.padding_bias(ids) + attention_bias.decoder_self_attention_bias(ids)
  else:
    names, ids = ("q_kernel", "kv_kernel"), tf.constant([[1, 2, 3, 0], [4, 5, 6, 7]])
    bias = attention_bias.padding_bias(ids)
  weights = np.concatenate([layer.kernels_for_inference()[name].numpy() for name in names], 1)
  biases = np.concatenate([layer.biases[name].numpy() for name in names])
  d = D_MODEL
  expected = _reference(
      query.astype(np.float64), memory.astype(np.float64), weights[:, :d], weights[:, d:2 * d],
      weights[:, 2 * d:], layer.output_kernel.numpy(), bias.numpy(), 2,
      (biases[:d], biases[d:2 * d], biases[2 * d:], layer.biases["output_kernel"].numpy()))
  kwargs = {} if self_attention else {"memory": memory}
  out, _ = _attend(layer, query, bias, training=False, **kwargs)
  np.testing.assert_allclose(out[0], expected[0], atol=1e-5)
  np.testing.assert_allclose(out[1, :2], expected[1, :2], atol=1e-5)
  if self_attention:  # one query position a step, over the keys written so far
    cache = {"key": tf.zeros([2, 2, 3, d // 2]), "value": tf.zeros([2, 2, 3, d // 2])}
    for step in range(3):
      row = tf.constant(query[:, step])
      out, cache = layer(row, attention_bias.cached_step_bias(3, step),
                         layout=TokenLayout.dense(2, 1), cache=cache, step=step)
      np.testing.assert_allclose(out.numpy()[0], expected[0, step], atol=1e-5)
  else:
    out, _ = _attend(layer, query, bias, cache=layer.project_memory(tf.constant(memory)),
                     training=False)
    np.testing.assert_allclose(out, expected, atol=1e-5)
  assert not MultiHeadAttention(2).biases  # none by default


def test_attention_weights_match_reference():
  layer = _cross_layer(2, seed=9)
  rng = np.random.default_rng(9)
  query = rng.normal(size=(2, 3, D_MODEL))
  memory = rng.normal(size=(2, 4, D_MODEL))
  bias = attention_bias.padding_bias(tf.constant([[1, 2, 0, 0], [3, 4, 5, 6]])).numpy()
  query_rows, layout = _rows(query)
  memory_rows, memory_layout = _rows(memory)
  weights = layer.attention_weights(query_rows, bias, layout, memory_rows, memory_layout)
  kv = layer.kv_kernel.numpy().astype(np.float64)
  q = _split_heads(query @ layer.q_kernel.numpy().astype(np.float64), 2)
  k = _split_heads(memory @ kv[:, :D_MODEL], 2)
  expected = testutil.softmax(q @ k.transpose(0, 1, 3, 2) * (D_MODEL // 2)**-0.5 + bias)
  np.testing.assert_allclose(weights.numpy(), expected, atol=1e-6)
  np.testing.assert_array_equal(weights.numpy()[0, :, :, 2:], 0.0)


def test_beam_queries_share_one_copy_of_the_memory():
  """K consecutive queries per source over the source's cached keys/values give what K tiled
  copies of the memory give."""
  layer = _cross_layer(4, seed=11)
  rng = np.random.default_rng(11)
  beams = 3
  memory = tf.constant(rng.normal(size=(2, 5, D_MODEL)), tf.float32)
  query = tf.constant(rng.normal(size=(2 * beams, 1, D_MODEL)), tf.float32)
  bias = attention_bias.padding_bias(tf.constant([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]]))
  shared, cache = _attend(layer, query, bias, cache=layer.project_memory(memory),
                         training=False)
  tiled = tf.repeat(memory, beams, axis=0)
  expected, no_cache = _attend(layer, query, tf.repeat(bias, beams, axis=0), memory=tiled,
                               training=False)
  np.testing.assert_allclose(shared, expected, atol=1e-6)
  assert cache["key"].shape[0] == 2 and no_cache is None  # the cross cache is returned as is


def _cached_steps_against_the_full_pass(layer, x, buffer_length):
  """Feeds x [1, T, d] to a 2-head self-attention `layer` one position a step through a cache
  of `buffer_length`, each step's output checked against the causal full pass; returns the
  cache."""
  length = x.shape[1]
  full, _ = _attend(layer, x, attention_bias.causal_bias(length), training=False)
  zeros = tf.zeros([1, 2, buffer_length, D_MODEL // 2])
  cache = {"key": zeros, "value": zeros}
  neg = attention_bias.large_negative(tf.float32)
  for i in range(length):
    step_bias = np.where(np.arange(buffer_length) > i, neg, 0.0).astype(np.float32)
    out, cache = _attend(layer, x[:, i:i + 1], tf.constant(step_bias[None, None, None]),
                         cache=cache, step=tf.constant(i), training=False)
    np.testing.assert_allclose(out[0, 0], full[0, i], atol=1e-5)
  return cache


def test_self_attention_cache_writes_at_decode_index():
  x = np.random.default_rng(7).normal(size=(1, 3, D_MODEL)).astype(np.float32)
  cache = _cached_steps_against_the_full_pass(_self_layer(2, seed=7), x, buffer_length=5)
  # slots after the last written position stay zero
  np.testing.assert_array_equal(cache["key"].numpy()[:, :, 3:], 0.0)


def test_attention_config_round_trip():
  layer = _self_layer(4)
  config = layer.get_config()
  assert config["num_heads"] == 4
  assert config["self_attention"] is True
  assert config["dropout_rate"] == 0.0
  clone = MultiHeadAttention.from_config(config)
  clone.build((None, None, D_MODEL))
  clone.set_weights(layer.get_weights())
  x = tf.random.stateless_normal([1, 3, D_MODEL], seed=[1, 2]).numpy()
  bias = tf.zeros([1, 1, 1, 3])
  np.testing.assert_array_equal(_attend(clone, x, bias, training=False)[0],
                                _attend(layer, x, bias, training=False)[0])
  cross = MultiHeadAttention.from_config(_cross_layer(2).get_config())
  assert cross.self_attention is False and cross.num_heads == 2


# ---------------------------------------------------------------- relative positions


def _relative_layer(num_heads, max_relative_position, seed=0):
  keras.utils.set_random_seed(seed)
  layer = MultiHeadAttention(num_heads, 0.0, self_attention=True,
                             max_relative_position=max_relative_position)
  layer.build((None, None, D_MODEL))
  return layer


def _relative_reference(x, layer, bias, num_heads, limit):
  """Shaw et al. (2018) equations 3-5 written out in float64, pair by pair: logits
  e_ij = q_i . (k_j + a^K_ij) / sqrt(D), outputs z_i = sum_j w_ij (v_j + a^V_ij), with
  a_ij the table row of clip(j - i, -K, K)."""
  q_w, k_w, v_w, o_w = _self_weights(layer)
  table_k = layer.relative_keys.numpy().astype(np.float64)
  table_v = layer.relative_values.numpy().astype(np.float64)
  q, k, v = (_split_heads(x @ w, num_heads) for w in (q_w, k_w, v_w))
  batch, heads, length, depth = q.shape
  logits = np.zeros((batch, heads, length, length))
  for i in range(length):
    for j in range(length):
      a_k = table_k[min(max(j - i, -limit), limit) + limit]
      logits[:, :, i, j] = np.einsum("bhd,bhd->bh", q[:, :, i], k[:, :, j] + a_k) / depth**0.5
  weights = testutil.softmax(logits + bias)
  context = np.zeros_like(q)
  for i in range(length):
    for j in range(length):
      a_v = table_v[min(max(j - i, -limit), limit) + limit]
      context[:, :, i] += weights[:, :, i, j, None] * (v[:, :, j] + a_v)
  return context.transpose(0, 2, 1, 3).reshape(batch, length, -1) @ o_w


@pytest.mark.parametrize("real_rows_only", [False, True])
def test_relative_self_attention_matches_a_hand_computed_reference(real_rows_only):
  """Distances clipped at 2 over 6 positions, padding and the causal mask in the bias."""
  num_heads, limit = 2, 2
  layer = _relative_layer(num_heads, limit, seed=5)
  x = np.random.default_rng(5).normal(size=(2, 6, D_MODEL)).astype(np.float32)
  ids = tf.constant([[3, 4, 5, 6, 7, 8], [8, 9, 10, 11, 0, 0]], tf.int32)
  real = ids.numpy() != 0
  bias = attention_bias.padding_bias(ids) + attention_bias.causal_bias(6)
  out, _ = _attend(layer, x, bias, real if real_rows_only else None, training=False)
  ref = _relative_reference(x.astype(np.float64), layer, bias.numpy().astype(np.float64),
                            num_heads, limit)
  np.testing.assert_allclose(out[real], ref[real], atol=1e-5)
  rows, layout = _rows(x)
  weights = layer.attention_weights(rows, bias, layout).numpy()  # [B, H, T, S]
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
  assert (weights[1, :, :, 4:] < 1e-6).all() and (np.triu(weights[0], 1) < 1e-6).all()


def test_relative_cached_steps_equal_the_full_pass():
  """Five positions, distances clipped at 2: the clipping reached in the last steps."""
  x = np.random.default_rng(8).normal(size=(1, 5, D_MODEL)).astype(np.float32)
  _cached_steps_against_the_full_pass(_relative_layer(2, 2, seed=8), x, buffer_length=7)


def test_relative_embeddings_depend_on_the_distance_only():
  layer = _relative_layer(2, 3)
  positions = tf.range(6)
  near = [t.numpy() for t in layer.relative_embeddings(positions, positions)]
  far = [t.numpy() for t in layer.relative_embeddings(positions + 100, positions + 100)]
  for a, b in zip(near, far):
    np.testing.assert_array_equal(a, b)
  keys = layer.relative_keys.numpy()
  np.testing.assert_array_equal(near[0][0, 5], keys[6])  # distance 5 clipped to 3: row K + 3
  np.testing.assert_array_equal(near[0][5, 0], keys[0])  # -5 clipped to -3: row 0
  np.testing.assert_array_equal(near[0][2, 3], keys[4])  # distance 1: row K + 1


def test_relative_positions_are_for_self_attention_only():
  with pytest.raises(ValueError, match="self-attention only"):
    MultiHeadAttention(2, 0.0, self_attention=False, max_relative_position=2)
