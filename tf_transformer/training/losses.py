"""Label-smoothed cross entropy over real target tokens, and the token statistics of a batch."""

from typing import NamedTuple

import tensorflow as tf



class _LossTerms(NamedTuple):
  """Per-row terms of float32 logits [N, V] (see `_loss_terms`)."""
  exp_shifted: tf.Tensor  # [N, V] exp(logits - row max)
  exp_sum: tf.Tensor  # [N] the row sums of exp_shifted
  log_normalizer: tf.Tensor  # [N] log Z
  loss: tf.Tensor  # [N] the label-smoothed loss
  nll: tf.Tensor  # [N] -log p(label)
  correct: tf.Tensor  # [N] 1.0 where the label's logit is the row's largest


def _loss_terms(logits, label_positions, label_smoothing: float) -> _LossTerms:
  """The loss terms of each row of float32 logits [N, V]; label_positions int [N, 2] holds
  (row, label).

  One pass each for the row max, exp(logits - max), its sum and the mean logit: the row max
  serves log Z, the accuracy (no argmax pass) and the softmax, which is exp_shifted / exp_sum
  (no second exp pass)."""
  row_max = tf.reduce_max(logits, axis=-1)
  exp_shifted = tf.exp(logits - row_max[:, tf.newaxis])
  exp_sum = tf.reduce_sum(exp_shifted, axis=-1)
  log_normalizer = row_max + tf.math.log(exp_sum)
  label_logits = tf.gather_nd(logits, label_positions)
  nll = log_normalizer - label_logits
  # -mean_v log p_v without materialising log-softmax: log Z - mean_v logits_v
  uniform = log_normalizer - tf.reduce_mean(logits, axis=-1)
  return _LossTerms(exp_shifted, exp_sum, log_normalizer,
                    (1.0 - label_smoothing) * nll + label_smoothing * uniform, nll,
                    _is_largest(label_logits, row_max))


def _label_positions(labels):
  """labels int [N] -> int [N, 2] of (row, label), to gather each row's label logit."""
  return tf.stack([tf.range(tf.shape(labels)[0], dtype=labels.dtype), labels], axis=1)


def _is_largest(label_logits, row_max):
  """float32 [N]: 1.0 where the label's logit is its row's largest (the argmax, ties aside)."""
  return tf.cast(label_logits >= row_max, tf.float32)


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
  label_positions = _label_positions(labels)

  @tf.custom_gradient
  def smoothed_and_nll(logits):
    terms = _loss_terms(logits, label_positions, label_smoothing)
    # the gradient recomputes the softmax from log Z rather than keep exp_shifted alive
    log_normalizer, loss, nll = terms.log_normalizer, terms.loss, terms.nll

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
  logits = tf.cast(logits, tf.float32)
  loss, nll = label_smoothed_cross_entropy(logits, labels, label_smoothing)
  correct = _is_largest(tf.gather_nd(logits, _label_positions(labels)),
                        tf.reduce_max(logits, axis=-1))
  if weights is None:
    weights = tf.ones_like(loss)
  return {
      "loss": tf.reduce_sum(loss * weights),
      "nll": tf.reduce_sum(nll * weights),
      "correct": tf.reduce_sum(correct * weights),
      "tokens": tf.reduce_sum(weights),
  }


# Logits per chunk of the fused projection and loss: 2M float32 (8 MB), about 262 tokens
# at an 8,000-piece vocabulary; bounded so the loss never holds a [tokens, vocab] tensor.
_CHUNK_LOGITS = 1 << 21
# ... but never fewer tokens than this: at a 32,000-piece vocabulary 2M logits are 65 tokens,
# and matmuls over so few rows ran 13% slower (docs/notes.md).
_MIN_CHUNK_TOKENS = 256


def _loss_gradient(d_hidden, d_kernel, d_bias, output_kernel, bias: tuple):
  """The gradient function of a fused loss's (sums, tokens) whose "loss" (sums[0]) has the
  gradients d_hidden, d_kernel (float32) and d_bias (float32, with `bias` = (output_bias,)),
  formed in the forward pass; the other sums and the token count have none."""

  def gradient(d_sums, d_tokens):
    del d_tokens  # the token count does not depend on the inputs
    d_loss = d_sums[0]
    return (d_hidden * tf.cast(d_loss, d_hidden.dtype),
            tf.cast(d_kernel * d_loss, output_kernel.dtype),
            *(tf.cast(d_bias * d_loss, bias[0].dtype) for _ in bias))

  return gradient


def projected_token_statistics(hidden, output_kernel, labels, label_smoothing: float,
                               chunk_tokens: int = 0, output_bias=None):
  """`token_statistics` of logits = hidden @ output_kernel (+ output_bias), with the gradient of
  "loss" formed in the forward pass, chunk by chunk of tokens.

  For each chunk the logits, their loss terms and d loss / d logits = softmax - q are computed
  and at once multiplied into the gradients of `hidden` and `output_kernel`, so at most one
  chunk's [chunk, vocab] logits exist at a time instead of the whole step's (autodiff keeps the
  logits for the backward pass and then makes their gradient: two [num_tokens, vocab] tensors
  plus temporaries, the largest buffers of a training step). The FLOPs are the same three
  matmuls; they are all spent here, so use it where the gradient is wanted (training).

  Args:
    hidden: [num_tokens, d_model] decoder states of real target tokens (compute dtype).
    output_kernel: [d_model, vocab_size] pre-softmax matrix (compute dtype).
    labels: int32 [num_tokens].
    label_smoothing: eps in [0, 1).
    chunk_tokens: tokens per chunk; 0 picks about 2M logits per chunk, at least 256 tokens.
    output_bias: optional float32 [vocab_size] added to the logits (the model's learned one).

  Returns:
    dict of float32 scalars as `token_statistics`: "loss", "nll", "correct", "tokens". Only
    "loss" has a gradient (towards `hidden`, `output_kernel` and `output_bias`); the others
    are statistics.
  """
  vocab_size = output_kernel.shape[-1]
  if not chunk_tokens:
    chunk_tokens = max(_MIN_CHUNK_TOKENS, _CHUNK_LOGITS // vocab_size)
  compute_dtype = hidden.dtype

  @tf.custom_gradient
  def summed(hidden, output_kernel, *bias):  # bias: () or (output_bias,)
    num_tokens = tf.shape(hidden)[0]
    kernel_rows = tf.transpose(output_kernel)  # -> [vocab_size, d_model]

    def chunk_step(start, d_kernel, d_bias, d_hidden, sums):
      h = hidden[start:start + chunk_tokens]
      y = labels[start:start + chunk_tokens]
      logits = tf.cast(tf.matmul(h, output_kernel), tf.float32)  # -> [chunk, vocab_size]
      if bias:
        logits += tf.cast(bias[0], tf.float32)
      label_positions = _label_positions(y)
      terms = _loss_terms(logits, label_positions, label_smoothing)
      # d loss / d logits = softmax - q, q = (1 - eps) onehot + eps / V
      d_logits = (terms.exp_shifted * (1.0 / terms.exp_sum)[:, tf.newaxis]
                  - label_smoothing / vocab_size)
      d_logits = tf.cast(tf.tensor_scatter_nd_sub(
          d_logits, label_positions, tf.fill(tf.shape(y), 1.0 - label_smoothing)),
          compute_dtype)
      d_kernel += tf.cast(tf.matmul(h, d_logits, transpose_a=True), tf.float32)
      if bias:
        d_bias += tf.reduce_sum(tf.cast(d_logits, tf.float32), axis=0)
      d_hidden = d_hidden.write(start // chunk_tokens, tf.matmul(d_logits, kernel_rows))
      sums += tf.stack([tf.reduce_sum(terms.loss), tf.reduce_sum(terms.nll),
                        tf.reduce_sum(terms.correct)])
      return start + chunk_tokens, d_kernel, d_bias, d_hidden, sums

    _, d_kernel, d_bias, d_hidden, sums = tf.while_loop(
        lambda start, *_: start < num_tokens, chunk_step,
        (tf.constant(0), tf.zeros(tf.shape(output_kernel), tf.float32),
         tf.zeros([vocab_size] if bias else [0], tf.float32),
         tf.TensorArray(compute_dtype, size=0, dynamic_size=True, infer_shape=False,
                        element_shape=tf.TensorShape([None, hidden.shape[-1]])),
         tf.zeros([3])),
        parallel_iterations=1)  # one chunk's logits alive at a time
    d_hidden = tf.reshape(d_hidden.concat(), tf.shape(hidden))

    return ((sums, tf.cast(num_tokens, tf.float32)),
            _loss_gradient(d_hidden, d_kernel, d_bias, output_kernel, bias))

  bias = () if output_bias is None else (output_bias,)
  sums, tokens = summed(hidden, output_kernel, *bias)
  return {"loss": sums[0], "nll": tf.stop_gradient(sums[1]),
          "correct": tf.stop_gradient(sums[2]), "tokens": tokens}


def symmetric_kl(logits_a, logits_b):
  """R-Drop's divergence of each row pair: float32 [N, V] logits of two passes -> float32 [N],
  (KL(p_a || p_b) + KL(p_b || p_a)) / 2 = sum_v (p_a - p_b)(log p_a - log p_b) / 2. Plain
  TensorFlow ops: autodiff gives its gradient (the unfused path; see `projected_rdrop_statistics`
  for the fused one)."""
  log_a = tf.nn.log_softmax(tf.cast(logits_a, tf.float32))
  log_b = tf.nn.log_softmax(tf.cast(logits_b, tf.float32))
  return 0.5 * tf.reduce_sum((tf.exp(log_a) - tf.exp(log_b)) * (log_a - log_b), axis=-1)


def rdrop_statistics(stats_a, stats_b, divergence, alpha: float):
  """The statistics of two passes over the same tokens combined as R-Drop's loss.

  Liang et al. (2021) minimise CE_a + CE_b + alpha * (KL(p_a||p_b) + KL(p_b||p_a)) / 2 a token;
  here it is halved, so that "loss", "nll" and "correct" read on one pass's scale (comparable
  with a run without R-Drop) while alpha weighs the divergence against the cross-entropy as in
  the paper.

  Args:
    stats_a, stats_b: `token_statistics` of each pass (sums over the same N tokens).
    divergence: float32 scalar, the summed `symmetric_kl` of the N token pairs.
    alpha: the divergence's weight.

  Returns:
    dict of float32 scalars: "loss" ((loss_a + loss_b) / 2 + alpha / 2 * divergence), "nll"
    and "correct" (the passes' means), "tokens" (N) and "rdrop_kl" (the divergence, a
    statistic: its gradient reaches "loss" only).
  """
  return {"loss": 0.5 * (stats_a["loss"] + stats_b["loss"]) + 0.5 * alpha * divergence,
          "nll": tf.stop_gradient(0.5 * (stats_a["nll"] + stats_b["nll"])),
          "correct": tf.stop_gradient(0.5 * (stats_a["correct"] + stats_b["correct"])),
          "tokens": stats_a["tokens"], "rdrop_kl": tf.stop_gradient(divergence)}


def projected_rdrop_statistics(hidden, output_kernel, labels, label_smoothing: float,
                               alpha: float, chunk_tokens: int = 0, output_bias=None):
  """`rdrop_statistics` of logits = hidden @ output_kernel (+ output_bias) for two passes over
  the same N tokens, fused by chunks as `projected_token_statistics`: each chunk's two [chunk,
  vocab] logits, their loss terms and d loss / d logits are made and multiplied into the
  gradients at once.

  For a pass a against its twin b (l = log p, KL_ab = KL(p_a || p_b)), per token:
    d loss / d z_a = (softmax_a - q) / 2 + alpha / 4 * (p_a * ((l_a - l_b) - KL_ab) + p_a - p_b)
  (the derivative of sum_v (p_a - p_b)(l_a - l_b) / 2 with respect to z_a is
  (p_a * ((l_a - l_b) - KL_ab) + p_a - p_b) / 2).

  Args:
    hidden: [2N, d_model] decoder states: rows [:N] of the first pass, [N:] of the second,
      token i of one the twin of token i of the other.
    output_kernel: [d_model, vocab_size] pre-softmax matrix (compute dtype).
    labels: int32 [N], the tokens' labels (the same for both passes).
    label_smoothing: eps in [0, 1).
    alpha: the divergence's weight (> 0).
    chunk_tokens: token pairs per chunk; 0 picks about 2M logits per chunk (both passes').
    output_bias: optional float32 [vocab_size] added to the logits.

  Returns:
    dict of float32 scalars as `rdrop_statistics`; only "loss" has a gradient.
  """
  vocab_size = output_kernel.shape[-1]
  if not chunk_tokens:
    chunk_tokens = max(_MIN_CHUNK_TOKENS // 2, _CHUNK_LOGITS // (2 * vocab_size))
  compute_dtype = hidden.dtype

  @tf.custom_gradient
  def summed(hidden, output_kernel, *bias):  # bias: () or (output_bias,)
    num_tokens = tf.shape(labels)[0]
    kernel_rows = tf.transpose(output_kernel)  # -> [vocab_size, d_model]

    def logits_of(h):
      logits = tf.cast(tf.matmul(h, output_kernel), tf.float32)  # -> [chunk, vocab_size]
      return logits + tf.cast(bias[0], tf.float32) if bias else logits

    def chunk_step(start, d_kernel, d_bias, d_hidden_a, d_hidden_b, sums):
      end = tf.minimum(start + chunk_tokens, num_tokens)  # (the first pass's rows end at N)
      h_a, h_b = hidden[start:end], hidden[num_tokens + start:num_tokens + end]
      y = labels[start:end]
      label_positions = _label_positions(y)
      logits_a, logits_b = logits_of(h_a), logits_of(h_b)
      terms_a = _loss_terms(logits_a, label_positions, label_smoothing)
      terms_b = _loss_terms(logits_b, label_positions, label_smoothing)
      p_a = terms_a.exp_shifted * (1.0 / terms_a.exp_sum)[:, tf.newaxis]
      p_b = terms_b.exp_shifted * (1.0 / terms_b.exp_sum)[:, tf.newaxis]
      # l_a - l_b = (z_a - z_b) - (log Z_a - log Z_b): finite where a probability underflows
      log_ratio = (logits_a - logits_b
                   - (terms_a.log_normalizer - terms_b.log_normalizer)[:, tf.newaxis])
      kl_ab = tf.reduce_sum(p_a * log_ratio, axis=-1)[:, tf.newaxis]
      kl_ba = -tf.reduce_sum(p_b * log_ratio, axis=-1)[:, tf.newaxis]
      difference = p_a - p_b
      smoothing = label_smoothing / vocab_size
      one_hot = tf.fill(tf.shape(y), 0.5 * (1.0 - label_smoothing))
      d_logits = []
      for p, signed_ratio, kl, signed_difference in ((p_a, log_ratio, kl_ab, difference),
                                                     (p_b, -log_ratio, kl_ba, -difference)):
        d = (0.5 * (p - smoothing)
             + 0.25 * alpha * (p * (signed_ratio - kl) + signed_difference))
        d_logits.append(tf.cast(tf.tensor_scatter_nd_sub(d, label_positions, one_hot),
                                compute_dtype))
      d_a, d_b = d_logits
      d_kernel += tf.cast(tf.matmul(h_a, d_a, transpose_a=True)
                          + tf.matmul(h_b, d_b, transpose_a=True), tf.float32)
      if bias:
        d_bias += tf.reduce_sum(tf.cast(d_a, tf.float32) + tf.cast(d_b, tf.float32), axis=0)
      index = start // chunk_tokens
      d_hidden_a = d_hidden_a.write(index, tf.matmul(d_a, kernel_rows))
      d_hidden_b = d_hidden_b.write(index, tf.matmul(d_b, kernel_rows))
      divergence = 0.5 * tf.reduce_sum(difference * log_ratio)
      sums += tf.stack([
          0.5 * tf.reduce_sum(terms_a.loss + terms_b.loss) + 0.5 * alpha * divergence,
          0.5 * tf.reduce_sum(terms_a.nll + terms_b.nll),
          0.5 * tf.reduce_sum(terms_a.correct + terms_b.correct), divergence])
      return start + chunk_tokens, d_kernel, d_bias, d_hidden_a, d_hidden_b, sums

    def gradient_rows():
      return tf.TensorArray(compute_dtype, size=0, dynamic_size=True, infer_shape=False,
                            element_shape=tf.TensorShape([None, hidden.shape[-1]]))

    _, d_kernel, d_bias, d_hidden_a, d_hidden_b, sums = tf.while_loop(
        lambda start, *_: start < num_tokens, chunk_step,
        (tf.constant(0), tf.zeros(tf.shape(output_kernel), tf.float32),
         tf.zeros([vocab_size] if bias else [0], tf.float32), gradient_rows(), gradient_rows(),
         tf.zeros([4])),
        parallel_iterations=1)  # one chunk's logits alive at a time
    d_hidden = tf.reshape(tf.concat([d_hidden_a.concat(), d_hidden_b.concat()], axis=0),
                          tf.shape(hidden))

    return ((sums, tf.cast(num_tokens, tf.float32)),
            _loss_gradient(d_hidden, d_kernel, d_bias, output_kernel, bias))

  bias = () if output_bias is None else (output_bias,)
  sums, tokens = summed(hidden, output_kernel, *bias)
  return {"loss": sums[0], "nll": tf.stop_gradient(sums[1]),
          "correct": tf.stop_gradient(sums[2]), "tokens": tokens,
          "rdrop_kl": tf.stop_gradient(sums[3])}


def batch_statistics(model, batch, label_smoothing: float, training: bool = True,
                     rdrop_alpha: float = 0.0):
  """Summed token statistics (see token_statistics) of one batch under `model`.

  Only real target tokens reach the [tokens, vocab] softmax, the costliest matmul of the step,
  unless the model keeps padded rows (`skip_padding` off, for static shapes): then they are
  weighted 0.

  Args:
    model: a Transformer.
    batch: (source_ids, target_input_ids, target_ids) int32 [batch, length].
    training: dropout on, and (except under float16) the projection and loss fused by chunks
      of tokens with their gradient (`projected_token_statistics`); off, the logits are made
      once, with no gradient work.
    rdrop_alpha: > 0 (with `training`): R-Drop. The batch passes twice through the model as
      one batch of twice the rows (the matrix products stay large), each copy under dropout
      masks of its own, and the statistics are `rdrop_statistics`' with this weight, over the
      batch's tokens (counted once); "rdrop_kl" is added.
  """
  rdrop = training and rdrop_alpha > 0
  if rdrop:
    batch = tuple(tf.concat([tensor, tensor], axis=0) for tensor in batch)
  source_ids, target_input_ids, target_ids = batch
  memory, memory_layout, bias = model.encode_rows(source_ids, training=training)
  hidden, layout = model.decode_rows(target_input_ids, memory, memory_layout, bias,
                                     training=training)
  labels, weights = layout.rows_of(target_ids), layout.row_weights
  # float16 keeps autodiff: its loss scale must reach d loss / d logits before the cast to
  # float16 (the fused pass forms them unscaled, and small probabilities would underflow)
  if training and weights is None and hidden.dtype != tf.float16:
    embedding = model.target_embedding
    kernel, output_bias = embedding.output_kernel()[0], embedding.output_bias_columns()
    if rdrop:  # the rows of the second copy follow those of the first, token for token
      return projected_rdrop_statistics(hidden, kernel, labels[:tf.shape(labels)[0] // 2],
                                        label_smoothing, rdrop_alpha, output_bias=output_bias)
    return projected_token_statistics(hidden, kernel, labels, label_smoothing,
                                      output_bias=output_bias)
  logits = model.logits(hidden)
  if rdrop:
    half = tf.shape(labels)[0] // 2
    halves = [(logits[:half], labels[:half]), (logits[half:], labels[half:])]
    stats_a, stats_b = (token_statistics(part, part_labels, label_smoothing,
                                         None if weights is None else weights[:half])
                        for part, part_labels in halves)
    divergence = symmetric_kl(logits[:half], logits[half:])
    if weights is not None:
      divergence *= weights[:half]
    return rdrop_statistics(stats_a, stats_b, tf.reduce_sum(divergence), rdrop_alpha)
  return token_statistics(logits, labels, label_smoothing, weights)
