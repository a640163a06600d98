"""Label-smoothed cross entropy over real target tokens, and the token statistics of a batch."""

import tensorflow as tf

from data_pipeline.token_ids import PAD_ID


def label_smoothed_cross_entropy(logits, labels, label_smoothing: float):
  """Per-token loss against q = (1 - eps) * onehot(label) + eps / V (section 5.4).

  The gradient is written by hand, d loss / d logits = softmax - q: autodiff of the same
  expression would hold three more [num_tokens, vocab_size] tensors at once, the largest of
  the step.

  Args:
    logits: float32 [num_tokens, vocab_size] (real tokens only, no padding).
    labels: int32 [num_tokens].
    label_smoothing: eps in [0, 1).

  Returns:
    loss: float32 [num_tokens], -sum_v q_v log p_v.
    nll: float32 [num_tokens], -log p(label): the unsmoothed loss behind perplexity.
  """
  logits = tf.cast(logits, tf.float32)
  label_positions = tf.stack([tf.range(tf.shape(labels)[0], dtype=labels.dtype), labels],
                             axis=1)

  @tf.custom_gradient
  def smoothed_and_nll(logits):
    log_normalizer = tf.reduce_logsumexp(logits, axis=-1)
    nll = log_normalizer - tf.gather_nd(logits, label_positions)
    # -mean_v log p_v without materialising log-softmax: log Z - mean_v logits_v
    uniform = log_normalizer - tf.reduce_mean(logits, axis=-1)
    loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform

    def gradient(d_loss, d_nll):
      # d loss = softmax - q and d nll = softmax - onehot, weighted by the incoming gradients
      d_loss = tf.zeros_like(loss) if d_loss is None else d_loss
      d_nll = tf.zeros_like(nll) if d_nll is None else d_nll
      vocab_size = tf.cast(tf.shape(logits)[-1], tf.float32)
      probs = tf.exp(logits - log_normalizer[:, tf.newaxis])
      d_logits = (probs * (d_loss + d_nll)[:, tf.newaxis]
                  - (label_smoothing / vocab_size) * d_loss[:, tf.newaxis])
      return tf.tensor_scatter_nd_sub(d_logits, label_positions,
                                      (1.0 - label_smoothing) * d_loss + d_nll)

    return (loss, nll), gradient

  return smoothed_and_nll(logits)


def token_statistics(logits, labels, label_smoothing: float, weights=None):
  """Sums over the real tokens of a batch, to be divided by the (global) token count.

  Args:
    logits: float32 [num_tokens, vocab_size].
    labels: int32 [num_tokens].
    weights: optional float32 [num_tokens], 1 at real tokens and 0 at padding (when padded
      positions are kept to keep shapes static); None: every token is real.

  Returns:
    dict of float32 scalars: "loss" (smoothed), "nll", "correct" and "tokens".
  """
  loss, nll = label_smoothed_cross_entropy(logits, labels, label_smoothing)
  correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=labels.dtype), labels),
                    tf.float32)
  if weights is None:
    weights = tf.ones_like(loss)
  return {
      "loss": tf.reduce_sum(loss * weights),
      "nll": tf.reduce_sum(nll * weights),
      "correct": tf.reduce_sum(correct * weights),
      "tokens": tf.reduce_sum(weights),
  }


def batch_statistics(model, batch, label_smoothing: float, static_shapes: bool = False,
                     training: bool = True):
  """Summed token statistics (see token_statistics) of one batch under `model`.

  Args:
    model: a Transformer.
    batch: (source_ids, target_input_ids, target_ids) int32 [batch, length].
    static_shapes: keep padded positions (weighted 0) instead of gathering the real ones, for
      XLA/TPU; otherwise only real target positions reach the [tokens, vocab] softmax, the
      costliest matmul of the step.
  """
  source_ids, target_input_ids, target_ids = batch
  memory, bias = model.encode(source_ids, training=training)
  hidden = model.decode(target_input_ids, memory, bias, training=training)
  real = tf.not_equal(target_ids, PAD_ID)
  if static_shapes:
    logits = model.logits(tf.reshape(hidden, [-1, model.d_model]))
    return token_statistics(logits, tf.reshape(target_ids, [-1]), label_smoothing,
                                   tf.reshape(tf.cast(real, tf.float32), [-1]))
  positions = tf.where(real)
  return token_statistics(model.logits(tf.gather_nd(hidden, positions)),
                                 tf.gather_nd(target_ids, positions), label_smoothing)
