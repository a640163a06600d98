"""Tests of tf_transformer/model.py: masking, padding invariance, weight sharing, decoding."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer.training import losses
from tf_transformer.model import Transformer

VOCAB = 50
CONFIG = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout_rate=0.0,
              attention_dropout_rate=0.0, relu_dropout_rate=0.0)


def _model(norm_position="post", seed=0, **overrides):
  keras.utils.set_random_seed(seed)
  kwargs = dict(CONFIG, source_vocab_size=VOCAB, target_vocab_size=VOCAB,
                shared_vocab=True, norm_position=norm_position)
  kwargs.update(overrides)
  return Transformer(**kwargs)


# relative positions of distances up to 2, shorter than the test sequences: the clipping counts
RELATIVE = dict(position_encoding="relative", max_relative_position=2)


# every option that holds a Marian model (config.ModelConfig) away from its default
MARIAN = dict(activation="swish", projection_biases=True, layer_norm_epsilon=1e-5,
              output_bias=True, sinusoid_layout="halves", scale_embeddings=False)


def _randomize_biases(model, seed=0):
  """Gives every bias of `model` random values (they start at zero, which would hide them)."""
  rng = np.random.default_rng(seed)
  for variable in model.weights:
    if "bias" in variable.path or variable.path.endswith("beta"):
      variable.assign(rng.normal(scale=0.5, size=variable.shape).astype(np.float32))
  return model


@pytest.fixture(scope="module", params=["post", "pre", "relative", "marian"])
def model(request):
  if request.param == "relative":
    return _model("pre", **RELATIVE)
  if request.param == "marian":
    return _randomize_biases(_model("post", **MARIAN))
  return _model(request.param)


def _ids(rng, shape, low=1):
  return rng.integers(low, VOCAB, size=shape).astype(np.int32)


def _batch(seed, source_length, target_length, padded_row, real_source_length):
  """rng and random (source [2, S], target [2, T]) ids, source row `padded_row` padded after
  `real_source_length` tokens."""
  rng = np.random.default_rng(seed)
  source = _ids(rng, (2, source_length))
  source[padded_row, real_source_length:] = 0
  return rng, source, _ids(rng, (2, target_length))


def _logits(model, source, target):
  return model((tf.constant(source), tf.constant(target)), training=False).numpy()


def test_causal_mask(model):
  rng, source, target = _batch(1, 6, 7, 1, 4)
  base = _logits(model, source, target)
  assert base.shape == (2, 7, VOCAB) and base.dtype == np.float32
  assert np.all(np.isfinite(base))
  for j in range(target.shape[1]):
    changed = target.copy()
    changed[:, j] = (changed[:, j] % (VOCAB - 1)) + 1  # another non-pad token
    assert np.all(changed[:, j] != target[:, j])
    out = _logits(model, source, changed)
    np.testing.assert_allclose(out[:, :j], base[:, :j], rtol=0, atol=1e-6)
    assert np.max(np.abs(out[:, j] - base[:, j])) > 1e-3, j


def test_source_padding_invariance(model):
  rng, source, target = _batch(2, 5, 6, 0, 3)
  base = _logits(model, source, target)
  padded_source = np.concatenate([source, np.zeros((2, 4), np.int32)], axis=1)
  out = _logits(model, padded_source, target)
  np.testing.assert_allclose(out, base, rtol=0, atol=1e-5)


def test_target_padding_invariance_of_logits_and_loss(model):
  rng = np.random.default_rng(3)
  source = _ids(rng, (2, 5))
  source[1, 2:] = 0
  lengths = np.array([6, 4])
  target_input = _ids(rng, (2, 6))
  target_input[1, 4:] = 0
  labels = _ids(rng, (2, 6))
  labels[1, 4:] = 0
  base = _logits(model, source, target_input)
  extra = 5
  padded_input = np.concatenate([target_input, np.zeros((2, extra), np.int32)], axis=1)
  padded_labels = np.concatenate([labels, np.zeros((2, extra), np.int32)], axis=1)
  out = _logits(model, source, padded_input)
  real = np.arange(6)[np.newaxis] < lengths[:, np.newaxis]
  np.testing.assert_allclose(out[:, :6][real], base[real], rtol=0, atol=1e-5)

  def stats(logits, label_ids):
    mask = label_ids != 0
    return {k: v.numpy() for k, v in losses.token_statistics(
        tf.constant(logits[mask]), tf.constant(label_ids[mask]), 0.1).items()}

  base_stats = stats(base, labels)
  padded_stats = stats(out, padded_labels)
  assert base_stats["tokens"] == padded_stats["tokens"] == lengths.sum()
  assert base_stats["correct"] == padded_stats["correct"]
  for key in ("loss", "nll"):
    np.testing.assert_allclose(padded_stats[key], base_stats[key], rtol=1e-6, atol=1e-5)


def test_other_sequences_in_batch_do_not_interact(model):
  rng, source, target = _batch(4, 5, 4, 0, 3)
  batch = _logits(model, source, target)
  single = _logits(model, source[:1, :3], target[:1])
  np.testing.assert_allclose(single[0], batch[0], rtol=0, atol=1e-5)


def _embedding_variables(model):
  return [v for v in model.trainable_variables if v.path.endswith("embeddings")]


def test_shared_vocab_one_variable_with_gradients_from_both_paths():
  model = _model("post")
  assert model.source_embedding is model.target_embedding
  embeddings = _embedding_variables(model)
  assert len(embeddings) == 1
  (shared,) = embeddings
  assert tuple(shared.shape) == (VOCAB, CONFIG["d_model"])
  assert len({id(v) for v in model.trainable_variables}) == len(model.trainable_variables)

  ids = tf.constant([[3, 7, 11, 0]], tf.int32)
  hidden = tf.random.stateless_normal([1, 4, CONFIG["d_model"]], seed=[1, 1])
  with tf.GradientTape(persistent=True) as tape:
    embed_loss = tf.reduce_sum(tf.square(model.source_embedding(ids)))
    logits_loss = tf.reduce_sum(tf.square(model.logits(hidden)))
    memory, _ = model.encode(ids, training=False)
    encoder_loss = tf.reduce_sum(tf.square(memory[:, :, :5]))
  for loss in (embed_loss, logits_loss, encoder_loss):
    grad = tape.gradient(loss, shared)
    assert grad is not None
    grad = tf.convert_to_tensor(grad).numpy()
    assert np.max(np.abs(grad)) > 0
  # the embedding-only gradient touches exactly the rows of the real source tokens
  grad = tf.convert_to_tensor(tape.gradient(embed_loss, shared)).numpy()
  touched = set(np.nonzero(np.abs(grad).sum(axis=1))[0].tolist())
  assert touched == {3, 7, 11}
  del tape


def test_unshared_vocab_two_matrices():
  model = _model("post", source_vocab_size=40, target_vocab_size=VOCAB, shared_vocab=False)
  assert model.source_embedding is not model.target_embedding
  shapes = sorted(tuple(v.shape) for v in _embedding_variables(model))
  assert shapes == [(40, CONFIG["d_model"]), (VOCAB, CONFIG["d_model"])]
  out = model((tf.constant([[39, 2, 0]]), tf.constant([[49, 1]])), training=False)
  assert out.shape == (1, 2, VOCAB)


def test_shared_vocab_reject_different_vocabularies():
  with pytest.raises(ValueError):
    Transformer(40, 50, shared_vocab=True, **CONFIG)


def test_cached_decoding_matches_full_forward(model):
  rng, source, target = _batch(5, 6, 5, 1, 3)
  target[1, 3:] = 0  # trailing padding in the second sequence
  full = _logits(model, source, target)
  memory, bias = model.encode(tf.constant(source), training=False)
  cache = model.init_decode_cache(memory, buffer_length=8)
  lengths = [5, 3]
  for i in range(target.shape[1]):
    step_logits, cache = model.decode_step(tf.constant(target[:, i]), tf.constant(i), bias,
                                           cache)
    assert step_logits.shape == (2, VOCAB)
    step_logits = step_logits.numpy()
    for b in range(2):
      if i < lengths[b]:
        np.testing.assert_allclose(step_logits[b], full[b, i], rtol=0, atol=1e-5,
                                   err_msg=f"sequence {b} step {i}")


def test_cached_decoding_under_tf_function(model):
  rng = np.random.default_rng(6)
  source = _ids(rng, (1, 4))
  target = _ids(rng, (1, 4))
  full = _logits(model, source, target)
  memory, bias = model.encode(tf.constant(source), training=False)
  cache = model.init_decode_cache(memory, buffer_length=6)
  step = tf.function(model.decode_step)
  for i in range(4):
    logits, cache = step(tf.constant(target[:, i]), tf.constant(i), bias, cache)
    np.testing.assert_allclose(logits.numpy()[0], full[0, i], rtol=0, atol=1e-5)


def test_skipping_padding_changes_neither_logits_nor_gradients():
  """Real-token rows (the default) against every padded position computed: the same logits at
  real positions, and the same loss and gradients (a float32 tolerance)."""
  skip = _model("pre", seed=2, skip_padding=True)
  dense = _model("pre", seed=3, skip_padding=False)
  dense.set_weights(skip.get_weights())
  rng, source, target = _batch(7, 5, 4, 0, 2)
  target[1, 2:] = 0
  a = _logits(skip, source, target)
  p = _logits(dense, source, target)
  np.testing.assert_allclose(a[0], p[0], atol=1e-5)
  np.testing.assert_allclose(a[1, :2], p[1, :2], atol=1e-5)
  labels = np.concatenate([target[:, 1:], np.full((2, 1), 2, np.int32)], axis=1)
  labels[target == 0] = 0
  batch = tuple(tf.constant(t) for t in (source, target, labels))
  results = []
  for model in (skip, dense):
    with tf.GradientTape() as tape:
      stats = losses.batch_statistics(model, batch, 0.1, training=False)
    results.append((stats, tape.gradient(stats["loss"], model.trainable_variables)))
  (skip_stats, skip_gradients), (dense_stats, dense_gradients) = results
  assert float(skip_stats["tokens"]) == float(dense_stats["tokens"]) == 6.0
  np.testing.assert_allclose(float(skip_stats["loss"]), float(dense_stats["loss"]), rtol=1e-6)
  for got, expected in zip(skip_gradients, dense_gradients):
    np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(),
                               tf.convert_to_tensor(expected).numpy(), atol=1e-5)


def test_dropout_only_in_training():
  model = _model("post", dropout_rate=0.3, attention_dropout_rate=0.3, relu_dropout_rate=0.3)
  inputs = (tf.constant([[5, 6, 7, 0]]), tf.constant([[1, 8, 9]]))
  eval_a = model(inputs, training=False).numpy()
  eval_b = model(inputs, training=False).numpy()
  np.testing.assert_array_equal(eval_a, eval_b)
  train_a = model(inputs, training=True).numpy()
  train_b = model(inputs, training=True).numpy()
  assert np.max(np.abs(train_a - train_b)) > 1e-4
  assert np.max(np.abs(train_a - eval_a)) > 1e-4


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_config_round_trip(norm_position):
  model = _model(norm_position, seed=4)
  config = model.get_config()
  for key, value in CONFIG.items():
    assert config[key] == value
  assert config["norm_position"] == norm_position
  assert config["shared_vocab"] is True
  clone = Transformer.from_config(config)
  assert len(clone.weights) == len(model.weights)
  assert len(clone.trainable_variables) == len(model.trainable_variables)
  assert [tuple(w.shape) for w in clone.weights] == [tuple(w.shape) for w in model.weights]
  clone.set_weights(model.get_weights())
  rng, source, target = _batch(8, 5, 4, 1, 3)
  np.testing.assert_array_equal(_logits(clone, source, target), _logits(model, source, target))


def test_marian_options_round_trip_and_add_their_weights():
  model = _randomize_biases(_model(seed=4, **MARIAN))
  config = model.get_config()
  assert {key: config[key] for key in MARIAN} == MARIAN
  clone = Transformer.from_config(config)
  assert [tuple(w.shape) for w in clone.weights] == [tuple(w.shape) for w in model.weights]
  clone.set_weights(model.get_weights())
  rng, source, target = _batch(8, 5, 4, 1, 3)
  np.testing.assert_array_equal(_logits(clone, source, target), _logits(model, source, target))
  layers = CONFIG["num_layers"]
  # a bias for each attention projection (self: qkv, output; cross: q, kv, output), and one of
  # the logits
  biases = layers * 2 + layers * 2 + layers * 3
  assert len(model.weights) == len(_model(seed=4).weights) + biases + 1
  assert tuple(model.target_embedding.output_bias.shape) == (VOCAB,)
  norms = [layer for layer in model._flatten_layers() if type(layer).__name__ == "LayerNorm"]
  assert norms and all(norm.epsilon == 1e-5 for norm in norms)


def test_a_checkpoint_holds_every_weight_of_the_marian_options(tmp_path):
  model = _randomize_biases(_model(seed=7, **MARIAN))
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
  clone = _model(seed=8, **MARIAN)
  tf.train.Checkpoint(model=clone).restore(path).assert_existing_objects_matched()
  for saved, restored in zip(model.weights, clone.weights):
    np.testing.assert_array_equal(saved.numpy(), restored.numpy(), err_msg=saved.path)


def test_the_fused_training_loss_of_a_model_with_an_output_bias_equals_its_logits_loss():
  """Training's fused projection and loss (batch_statistics with training) against the loss of
  `logits` (which add the bias): the same loss and gradients, the output bias's included."""
  model = _randomize_biases(_model(seed=6, **MARIAN))
  rng, source, target = _batch(9, 5, 4, 1, 3)
  labels = np.concatenate([target[:, 1:], np.full((2, 1), 3, np.int32)], axis=1)
  batch = tuple(tf.constant(t) for t in (source, target, labels))
  results = []
  for training in (True, False):  # dropout is 0: the two passes differ in the loss only
    with tf.GradientTape() as tape:
      stats = losses.batch_statistics(model, batch, 0.1, training=training)
    results.append((float(stats["loss"]), tape.gradient(stats["loss"], model.trainable_variables)))
  (fused, fused_gradients), (plain, plain_gradients) = results
  np.testing.assert_allclose(fused, plain, rtol=1e-6)
  names = [variable.path for variable in model.trainable_variables]
  assert any(name.endswith("output_bias") for name in names)
  for name, got, expected in zip(names, fused_gradients, plain_gradients):
    np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(),
                               tf.convert_to_tensor(expected).numpy(), atol=1e-5, err_msg=name)


def test_relative_config_round_trip():
  model = _model(seed=4, **RELATIVE)
  clone = Transformer.from_config(model.get_config())
  assert [tuple(w.shape) for w in clone.weights] == [tuple(w.shape) for w in model.weights]
  clone.set_weights(model.get_weights())
  rng, source, target = _batch(8, 5, 4, 1, 3)
  np.testing.assert_array_equal(_logits(clone, source, target), _logits(model, source, target))
  assert len(model.weights) == len(_model(seed=4).weights) + 2 * 2 * CONFIG["num_layers"]


def test_cross_attention_weights_match_a_float64_reference():
  """One post-norm layer, one head: embed, causal self-attention, residual + layer norm, then
  the cross-attention softmax, all in numpy float64 from the model's weights."""
  from tf_transformer.layers.embedding import positional_encoding

  d = 8
  model = _model("post", seed=3, num_layers=1, d_model=d, num_heads=1, d_ff=16)
  source = np.array([[5, 6, 7, 3, 0]], np.int32)
  target_input = np.array([[2, 9, 11, 0]], np.int32)
  memory, cross_bias = model.encode(tf.constant(source), training=False)
  weights = model.cross_attention_weights(tf.constant(target_input), memory, cross_bias).numpy()

  f64 = lambda v: np.asarray(v, np.float64)  # noqa: E731
  layer = model.decoder.stack[0]
  x = f64(model.target_embedding.embeddings)[target_input[0]] * d**0.5
  x += f64(positional_encoding(tf.range(4), d))
  x[target_input[0] == 0] = 0.0
  qkv = x @ f64(layer.self_attention.qkv_kernel)
  q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
  hidden = np.triu(np.ones((4, 4)), 1).astype(bool) | (target_input[0] == 0)[None, :]
  self_weights = testutil.softmax(np.where(hidden, -1e9, q @ k.T / d**0.5))
  y = x + (self_weights @ v) @ f64(layer.self_attention.output_kernel)
  norm = layer.self_attention_block.norm
  y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-6)
  y = y * f64(norm.gamma) + f64(norm.beta)
  query = y @ f64(layer.cross_attention.q_kernel)
  keys = f64(memory[0]) @ f64(layer.cross_attention.kv_kernel)[:, :d]
  expected = testutil.softmax(np.where(source[0] == 0, -1e9, query @ keys.T / d**0.5))
  real = target_input[0] != 0  # the rows of padded positions are filler
  np.testing.assert_allclose(weights[0][real], expected[real], atol=1e-5)


@pytest.mark.parametrize("position_encoding", ["relative", "sinusoidal"])
def test_relative_positions_see_no_absolute_position(position_encoding):
  """A source shifted right behind padding (every absolute position + 3) encodes to the same
  states with relative positions; sinusoidal ones see the shift."""
  model = _model(**(RELATIVE if position_encoding == "relative" else {}))
  rng = np.random.default_rng(7)
  source = _ids(rng, (1, 5))
  shifted = np.concatenate([np.zeros((1, 3), np.int32), source], axis=1)
  memory, _ = model.encode(tf.constant(source), training=False)
  memory_shifted, _ = model.encode(tf.constant(shifted), training=False)
  difference = np.abs(memory.numpy()[0] - memory_shifted.numpy()[0, 3:]).max()
  if position_encoding == "relative":
    assert difference < 1e-5
  else:
    assert difference > 1e-2
