"""Label-smoothed cross entropy over real target tokens, and its token statistics."""

import tensorflow as tf


def label_smoothed_cross_entropy(logits, labels, label_smoothing: float):
  """Per-token loss against q = (1 - eps) * onehot(label) + eps / V (section 5.4).

  Args:
    logits: float32 [num_tokens, vocab_size] (real tokens only, no padding).
    labels: int32 [num_tokens].
    label_smoothing: eps in [0, 1).

  Returns:
    loss: float32 [num_tokens], -sum_v q_v log p_v.
    nll: float32 [num_tokens], -log p(label): the unsmoothed loss behind perplexity.
  """
  logits = tf.cast(logits, tf.float32)
  log_normalizer = tf.reduce_logsumexp(logits, axis=-1)
  label_logits = tf.gather(logits, labels, axis=1, batch_dims=1)
  nll = log_normalizer - label_logits
  # -mean_v log p_v without materialising log-softmax: log Z - mean_v logits_v
  uniform = log_normalizer - tf.reduce_mean(logits, axis=-1)
  loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
  return loss, nll


def token_statistics(logits, labels, label_smoothing: float):
  """Sums over the real tokens of a batch, to be divided by the (global) token count.

  Args:
    logits: float32 [num_tokens, vocab_size].
    labels: int32 [num_tokens].

  Returns:
    dict of float32 scalars: "loss" (smoothed), "nll", "correct" and "tokens".
  """
  loss, nll = label_smoothed_cross_entropy(logits, labels, label_smoothing)
  predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
  return {
      "loss": tf.reduce_sum(loss),
      "nll": tf.reduce_sum(nll),
      "correct": tf.reduce_sum(tf.cast(tf.equal(predictions, labels), tf.float32)),
      "tokens": tf.cast(tf.size(labels), tf.float32),
  }
