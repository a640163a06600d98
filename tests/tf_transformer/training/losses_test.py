"""Tests of tf_transformer/training/losses.py against float64 numpy hand computations."""

import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer.training import losses

LOGITS = np.array([[2.0, -1.0, 0.5, 0.0],
                   [0.3, 0.1, -2.0, 1.7]], np.float64)
LABELS = np.array([2, 3], np.int32)


def _reference(logits, labels, eps):
  num_classes = logits.shape[-1]
  q = (1.0 - eps) * np.eye(num_classes)[labels] + eps / num_classes
  log_p = testutil.log_softmax(logits)
  return -(q * log_p).sum(axis=-1), -log_p[np.arange(len(labels)), labels]


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothed_cross_entropy_matches_hand_computation(eps):
  loss, nll = losses.label_smoothed_cross_entropy(
      tf.constant(LOGITS, tf.float32), tf.constant(LABELS), eps)
  ref_loss, ref_nll = _reference(LOGITS, LABELS, eps)
  assert loss.shape == (2,) and nll.shape == (2,)
  np.testing.assert_allclose(loss.numpy(), ref_loss, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(nll.numpy(), ref_nll, rtol=1e-6, atol=1e-6)
  if eps == 0.0:
    np.testing.assert_allclose(loss.numpy(), nll.numpy(), rtol=1e-6)


def test_label_smoothed_loss_is_stable_for_large_logits():
  logits = tf.constant([[1000.0, 0.0, -1000.0]], tf.float32)
  loss, nll = losses.label_smoothed_cross_entropy(logits, tf.constant([0]), 0.1)
  assert np.all(np.isfinite(loss.numpy())) and np.all(np.isfinite(nll.numpy()))
  np.testing.assert_allclose(nll.numpy(), [0.0], atol=1e-6)
  # -(0.9 + 0.1/3) * 0 - 0.1/3 * (-1000) - 0.1/3 * (-2000)
  np.testing.assert_allclose(loss.numpy(), [100.0], rtol=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_token_statistics(eps):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(7, 5))
  labels = rng.integers(0, 5, size=7).astype(np.int32)
  labels[:3] = np.argmax(logits[:3], axis=-1)  # at least some correct predictions
  stats = losses.token_statistics(tf.constant(logits, tf.float32), tf.constant(labels), eps)
  assert set(stats) == {"loss", "nll", "correct", "tokens"}
  ref_loss, ref_nll = _reference(logits, labels, eps)
  np.testing.assert_allclose(stats["loss"].numpy(), ref_loss.sum(), rtol=1e-5)
  np.testing.assert_allclose(stats["nll"].numpy(), ref_nll.sum(), rtol=1e-5)
  expected_correct = float(np.sum(np.argmax(logits, axis=-1) == labels))
  assert expected_correct >= 3
  assert float(stats["correct"]) == expected_correct
  assert float(stats["tokens"]) == 7.0
  for value in stats.values():
    assert value.dtype == tf.float32 and value.shape == ()


def _reference_gradient(logits, labels, eps, d_loss, d_nll):
  """d (sum d_loss * loss + sum d_nll * nll) / d logits, in float64."""
  num_classes = logits.shape[-1]
  probs = np.exp(testutil.log_softmax(logits))
  onehot = np.eye(num_classes)[labels]
  q = (1.0 - eps) * onehot + eps / num_classes
  return d_loss[:, None] * (probs - q) + d_nll[:, None] * (probs - onehot)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
def test_hand_written_gradient_matches_float64_reference(eps, mode):
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(6, 9)) * 3.0
  labels = rng.integers(0, 9, size=6).astype(np.int32)
  d_loss, d_nll = rng.uniform(0.1, 2.0, size=6), rng.uniform(-1.0, 1.0, size=6)

  def gradients(x):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(x)
      loss, nll = losses.label_smoothed_cross_entropy(x, tf.constant(labels), eps)
      both = tf.reduce_sum(loss * d_loss.astype(np.float32)) + tf.reduce_sum(
          nll * d_nll.astype(np.float32))
      loss_only = tf.reduce_sum(loss * d_loss.astype(np.float32))
    return tape.gradient(both, x), tape.gradient(loss_only, x)

  if mode != "eager":
    gradients = tf.function(gradients, jit_compile=mode == "xla")
  both, loss_only = gradients(tf.constant(logits, tf.float32))
  np.testing.assert_allclose(both.numpy(), _reference_gradient(logits, labels, eps, d_loss,
                                                               d_nll), atol=1e-6)
  np.testing.assert_allclose(loss_only.numpy(), _reference_gradient(
      logits, labels, eps, d_loss, np.zeros(6)), atol=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("num_tokens,chunk_tokens,with_bias",
                         [(10, 3, False), (10, 10, False), (4, 0, False), (0, 3, False),
                          (10, 3, True), (0, 3, True)])
def test_fused_projection_and_loss_match_float64_reference(eps, num_tokens, chunk_tokens,
                                                           with_bias):
  """Sums and gradients of `projected_token_statistics` (chunks of 3 leave a partial last
  chunk; 0 tokens is a replica with an empty share; an output bias added to the logits) equal
  float64 autodiff-free references."""
  rng = np.random.default_rng(2)
  hidden = rng.normal(size=(num_tokens, 4))
  kernel = rng.normal(size=(4, 9))
  output_bias = rng.normal(size=9) if with_bias else np.zeros(9)
  labels = rng.integers(0, 9, size=num_tokens).astype(np.int32)
  logits = hidden @ kernel + output_bias
  labels[:2] = np.argmax(logits[:2], axis=-1)
  scale = 2.5  # an upstream gradient, as a loss scale or a 1 / tokens factor gives

  @tf.function
  def run(h, k, b):
    with tf.GradientTape() as tape:
      tape.watch([h, k, b])
      stats = losses.projected_token_statistics(h, k, tf.constant(labels), eps, chunk_tokens,
                                                output_bias=b if with_bias else None)
      objective = scale * stats["loss"] + 3.0 * stats["nll"] + 5.0 * stats["correct"]
    return stats, tape.gradient(objective, [h, k, b])

  stats, (d_hidden, d_kernel, d_bias) = run(tf.constant(hidden, tf.float32),
                                            tf.constant(kernel, tf.float32),
                                            tf.constant(output_bias, tf.float32))
  ref_loss, ref_nll = _reference(logits, labels, eps)
  np.testing.assert_allclose(float(stats["loss"]), ref_loss.sum(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(stats["nll"]), ref_nll.sum(), rtol=1e-5, atol=1e-6)
  assert float(stats["correct"]) == float(np.sum(np.argmax(logits, axis=-1) == labels))
  assert float(stats["tokens"]) == num_tokens
  d_logits = scale * _reference_gradient(logits, labels, eps, np.ones(num_tokens),
                                         np.zeros(num_tokens))
  np.testing.assert_allclose(d_hidden.numpy(), d_logits @ kernel.T, atol=1e-5)
  np.testing.assert_allclose(d_kernel.numpy(), hidden.T @ d_logits, atol=1e-5)
  if with_bias:
    np.testing.assert_allclose(d_bias.numpy(), d_logits.sum(axis=0), atol=1e-5)
  else:
    assert d_bias is None


def _rdrop_reference(hidden, kernel, output_bias, labels, eps, alpha):
  """float64 R-Drop sums of two passes (hidden [2N, d]: rows [:N] and [N:]) over N tokens:
  (loss, nll, correct, rdrop_kl), the loss being (CE_a + CE_b) / 2 + alpha / 2 * (KL_ab +
  KL_ba) / 2 summed over the tokens."""
  count = len(labels)
  logits = hidden @ kernel + output_bias
  log_p = testutil.log_softmax(logits)
  (loss_a, nll_a), (loss_b, nll_b) = (_reference(logits[rows], labels, eps)
                                      for rows in (slice(0, count), slice(count, None)))
  log_a, log_b = log_p[:count], log_p[count:]
  divergence = 0.5 * ((np.exp(log_a) - np.exp(log_b)) * (log_a - log_b)).sum()
  correct = sum((np.argmax(logits[rows], axis=-1) == labels).sum()
                for rows in (slice(0, count), slice(count, None)))
  return (0.5 * (loss_a.sum() + loss_b.sum()) + 0.5 * alpha * divergence,
          0.5 * (nll_a.sum() + nll_b.sum()), 0.5 * correct, divergence)


def _numeric_gradient(fn, values, step=1e-6):
  """Central differences of the float64 scalar fn(values) towards each array of `values`."""
  gradients = []
  for index, value in enumerate(values):
    gradient = np.zeros_like(value)
    for position in np.ndindex(value.shape):
      shifted = [v.copy() for v in values]
      shifted[index][position] += step
      up = fn(*shifted)
      shifted[index][position] -= 2 * step
      gradient[position] = (up - fn(*shifted)) / (2 * step)
    gradients.append(gradient)
  return gradients


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("num_tokens,chunk_tokens", [(7, 3), (7, 7), (0, 3)])
def test_rdrop_statistics_and_gradients_match_float64_reference(fused, num_tokens, chunk_tokens):
  """R-Drop's sums over two passes (chunks of 3 leave a partial last chunk; 0 tokens is a
  replica with an empty share) and their gradients, fused (`projected_rdrop_statistics`) and
  unfused (`symmetric_kl` under autodiff), equal a float64 reference and its numeric
  gradient."""
  rng = np.random.default_rng(3)
  eps, alpha, scale = 0.1, 3.0, 2.5
  hidden = rng.normal(size=(2 * num_tokens, 4))
  hidden[num_tokens:] += 0.3 * rng.normal(size=(num_tokens, 4))  # a pass of other dropout
  kernel = rng.normal(size=(4, 9))
  output_bias = rng.normal(size=9)
  labels = rng.integers(0, 9, size=num_tokens).astype(np.int32)

  @tf.function
  def run(h, k, b):
    with tf.GradientTape() as tape:
      tape.watch([h, k, b])
      if fused:
        stats = losses.projected_rdrop_statistics(h, k, tf.constant(labels), eps, alpha,
                                                  chunk_tokens, output_bias=b)
      else:
        logits = tf.matmul(h, k) + b
        halves = (logits[:num_tokens], logits[num_tokens:])
        stats = losses.rdrop_statistics(
            *(losses.token_statistics(half, labels, eps) for half in halves),
            tf.reduce_sum(losses.symmetric_kl(*halves)), alpha)
      objective = scale * stats["loss"] + 3.0 * stats["nll"] + 5.0 * stats["rdrop_kl"]
    return stats, tape.gradient(objective, [h, k, b])

  stats, gradients = run(*(tf.constant(value, tf.float32)
                           for value in (hidden, kernel, output_bias)))
  loss, nll, correct, divergence = _rdrop_reference(hidden, kernel, output_bias, labels, eps,
                                                    alpha)
  np.testing.assert_allclose(float(stats["loss"]), loss, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(stats["nll"]), nll, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(stats["rdrop_kl"]), divergence, rtol=1e-5, atol=1e-6)
  assert float(stats["correct"]) == correct and float(stats["tokens"]) == num_tokens
  # only "loss" has a gradient: the others are statistics
  expected = _numeric_gradient(
      lambda h, k, b: scale * _rdrop_reference(h, k, b, labels, eps, alpha)[0],
      [hidden, kernel, output_bias])
  for got, want in zip(gradients, expected):
    np.testing.assert_allclose(got.numpy(), want, atol=1e-4)


def test_rdrop_divergence_is_zero_between_equal_passes_and_stable_for_large_logits():
  same = tf.constant(LOGITS * 1000.0, tf.float32)
  np.testing.assert_array_equal(losses.symmetric_kl(same, same).numpy(), 0.0)
  other = tf.constant(LOGITS[::-1] * 1000.0, tf.float32)
  assert np.isfinite(losses.symmetric_kl(same, other).numpy()).all()
  hidden = tf.concat([same, other], axis=0)
  stats = losses.projected_rdrop_statistics(hidden, tf.eye(4), tf.constant(LABELS), 0.1, 1.0)
  assert all(np.isfinite(float(value)) for value in stats.values()), stats
