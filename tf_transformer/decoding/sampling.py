"""Random sampling over a `symbols_to_logits_fn`, in one tf.while_loop (it never imports a model).

Each row draws its next token from softmax(logits / temperature), restricted to the top_k most
probable tokens (0: all) and then to the smallest set of those whose probability reaches top_p
(nucleus sampling, Holtzman et al., 2020), until it writes EOS or reaches its length limit.

The draws are Gumbel-max: the token with the largest filtered logit + Gumbel noise, the noise
of a row being a hash of (its seed, the step, the token id) in integer arithmetic. So a row's
sample depends on its own seed alone, not on the batch it is decoded in, its position there or
whether XLA compiled the loop; and a smaller top_k or top_p only removes candidates.

Sizes: B rows, V vocabulary, L the width of the output ids.
"""

import tensorflow as tf

from tf_transformer.decoding import logit_filters
from tf_transformer.decoding.search_ops import NEG_INF, length_penalty, top_k_rows

_MASK32 = 0xFFFFFFFF


def _mix(x):
  """int64 [...] in [0, 2^32) -> int64 [...] in [0, 2^32): a 32-bit integer hash (two
  multiply-xorshift rounds; every product stays below 2^59, so int64 never overflows)."""
  x = tf.bitwise.bitwise_and((tf.bitwise.right_shift(x, 16) ^ x) * 0x45D9F3B, _MASK32)
  x = tf.bitwise.bitwise_and((tf.bitwise.right_shift(x, 16) ^ x) * 0x45D9F3B, _MASK32)
  return tf.bitwise.right_shift(x, 16) ^ x


def row_keys(seeds, step):
  """int64 [B] seeds (any values), int32 scalar step -> int64 [B] in [0, 2^32): one key per row
  and step, from which `gumbel_noise` draws."""
  seeds = tf.cast(seeds, tf.int64)
  low = tf.bitwise.bitwise_and(seeds, _MASK32)
  high = tf.bitwise.bitwise_and(tf.bitwise.right_shift(seeds, 32), _MASK32)
  key = _mix(low ^ _mix(high))
  return _mix(key ^ _mix(tf.cast(step, tf.int64) + 0x9E3779B9))


def gumbel_noise(keys, token_ids):
  """Standard Gumbel noise, -log(-log(U)), U uniform in (0, 1): float32 [B, N].

  Args:
    keys: int64 [B], from `row_keys`.
    token_ids: int32 [B, N] or [N], the token each noise value is for.
  """
  tokens = tf.cast(token_ids, tf.int64)
  if tokens.shape.rank == 1:
    tokens = tokens[tf.newaxis]
  bits = _mix(tf.bitwise.bitwise_and(keys[:, tf.newaxis] + tokens * 0x9E3779B9, _MASK32))
  # the top 24 bits (a float32's precision) + 1/2, over 2^24: strictly inside (0, 1)
  uniform = (tf.cast(tf.bitwise.right_shift(bits, 8), tf.float32) + 0.5) / 2.0**24
  return -tf.math.log(-tf.math.log(uniform))


def nucleus_mask(sorted_logits, top_p: float):
  """bool [B, N]: for logits sorted descending on each row (float32 [B, N]), the smallest
  prefix of the row whose probability (softmax over the row) reaches top_p; the first is always
  kept."""
  probs = tf.nn.softmax(sorted_logits, axis=-1)
  before = tf.math.cumsum(probs, axis=-1, exclusive=True)
  return before < top_p


def candidates(logits, top_k: int, top_p: float):
  """The tokens a row may draw from and their logits (float32 [B, N], NEG_INF for a token that
  the nucleus leaves out), int32 [B, N] ids (N = top_k, or V with top_k 0); with neither filter,
  the logits as they are and int32 [V] ids 0..V-1, the same for every row.

  Args:
    logits: float32 [B, V], already divided by the temperature.
    top_k: 0 (all) or the number of most probable tokens kept.
    top_p: the nucleus's probability, in (0, 1] (1: no nucleus).
  """
  vocab_size = logits.shape[-1] or tf.shape(logits)[-1]
  if top_k and (not isinstance(vocab_size, int) or top_k < vocab_size):
    values, ids = top_k_rows(logits, top_k)  # -> [B, k], descending
  elif top_p < 1.0:
    values, ids = tf.math.top_k(logits, k=tf.shape(logits)[-1])  # a sort of each row
  else:
    return logits, tf.range(tf.shape(logits)[-1])
  if top_p < 1.0:
    values = tf.where(nucleus_mask(values, top_p), values, NEG_INF)
  return values, ids


def draw(logits, keys, top_k: int, top_p: float, temperature: float):
  """int32 [B]: one token a row, drawn from the filtered softmax(logits / temperature)
  (temperature 0: the most probable token).

  Args:
    logits: float32 [B, V], NEG_INF where a token is not allowed.
    keys: int64 [B], from `row_keys`.
  """
  if temperature == 0.0:
    return tf.argmax(logits, axis=-1, output_type=tf.int32)
  values, ids = candidates(logits / temperature, top_k, top_p)
  noisy = tf.where(values > NEG_INF / 2, values + gumbel_noise(keys, ids), 2 * NEG_INF)
  best = tf.argmax(noisy, axis=-1, output_type=tf.int32)
  return best if ids.shape.rank == 1 else tf.gather(ids, best, batch_dims=1)


def sample(symbols_to_logits_fn, initial_ids, initial_cache, seeds, max_decode_length,
           eos_id: int, *, top_k: int = 0, top_p: float = 1.0, temperature: float = 1.0,
           alpha: float = 0.0, min_decode_length=0, buffer_length=None, prefix_ids=None,
           gives_log_probs: bool = False,
           repetition: logit_filters.RepetitionControls = logit_filters.RepetitionControls()):
  """One random output per row, drawn token by token.

  Args:
    symbols_to_logits_fn: fn(ids [B], step int32 scalar, cache) -> (logits float32 [B, V],
      cache): the next-token logits after `ids`, the token at position `step`.
    initial_ids: int32 [B], the start token of each row.
    initial_cache: nested structure of [B, ...] tensors.
    seeds: int64 [B], each row's seed.
    max_decode_length: int32 scalar or [B], at most this many tokens (EOS included).
    eos_id: end-of-sentence id.
    top_k, top_p, temperature: the distribution drawn from (see `draw`).
    alpha: length-penalty exponent of the scores.
    min_decode_length: EOS cannot be drawn before this many tokens (EOS included).
    buffer_length: L (>= every max_decode_length; required when that is a tensor).
    prefix_ids: optional int32 [B, P]: each row's first tokens, forced (0-padded), as in
      beam_search.
    gives_log_probs: symbols_to_logits_fn gives the log-probabilities to score with (as in
      beam_search); the draws are from their softmax all the same.
    repetition: logit_filters.RepetitionControls (the penalty changes the distribution drawn
      from and scored, as in beam_search).

  Returns:
    ids: int32 [B, 1, L], EOS included, then 0s (a row that reached its limit has no EOS).
    scores: float32 [B, 1], the model's log-probability of each output (its whole
      distribution at temperature 1, as a forced decoding scores it) over the length penalty.
  """
  batch = tf.shape(initial_ids)[0]
  if buffer_length is None:
    buffer_length = max_decode_length
  limits = tf.broadcast_to(tf.convert_to_tensor(max_decode_length, tf.int32), [batch])
  min_decode_length = tf.convert_to_tensor(min_decode_length, tf.int32)
  seeds = tf.convert_to_tensor(seeds, tf.int64)
  filters = logit_filters.for_search(eos_id, 1, prefix_ids, repetition)

  def not_done(step, last_ids, ids, log_probs, lengths, finished, cache):
    return tf.logical_not(tf.reduce_all(finished | (step >= limits)))

  def body(step, last_ids, ids, log_probs, lengths, finished, cache):
    logits, cache = symbols_to_logits_fn(last_ids, step, cache)
    logits = tf.cast(logits, tf.float32)  # -> [B, V]
    context = logit_filters.context(filters, step, lambda: ids, step + 1 < min_decode_length)
    logits = filters.transform(logits, context)
    allowed = filters.mask(logits, context)
    tokens = draw(allowed, row_keys(seeds, step), top_k, top_p, temperature)
    token_log_probs = tf.gather(logits, tokens, batch_dims=1)
    if not gives_log_probs:
      token_log_probs -= tf.reduce_logsumexp(logits, axis=-1)
    writing = tf.logical_not(finished) & (step < limits)  # [B]
    tokens = tf.where(writing, tokens, 0)
    ids += tokens[:, tf.newaxis] * tf.one_hot(step, buffer_length, dtype=tf.int32)
    log_probs += tf.where(writing, token_log_probs, 0.0)
    lengths += tf.cast(writing, tf.int32)
    finished |= writing & tf.equal(tokens, eos_id)
    state = (step + 1, tokens, ids, log_probs, lengths, finished, cache)
    return tf.nest.map_structure(lambda new, old: tf.ensure_shape(new, old.shape), state,
                                 initial)

  initial = (tf.constant(0), tf.convert_to_tensor(initial_ids, tf.int32),
             tf.zeros([batch, buffer_length], tf.int32), tf.zeros([batch]),
             tf.zeros([batch], tf.int32), tf.fill([batch], False), initial_cache)
  _, _, ids, log_probs, lengths, _, _ = tf.while_loop(not_done, body, initial)
  scores = log_probs / length_penalty(lengths, alpha)
  return ids[:, tf.newaxis], scores[:, tf.newaxis]
