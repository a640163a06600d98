"""Decoding a Transformer: its `symbols_to_logits_fn` under a strategy (beam search, sampling),
forced decoding (`score`) and the attention behind an output."""

import tensorflow as tf

from data_pipeline.token_ids import BOS_ID, EOS_ID, PAD_ID, decoder_inputs
from tf_transformer.config import DecodeConfig
from tf_transformer.decoding import ensemble, search_ops, strategies
from tf_transformer.decoding import shortlist as shortlist_lib
from tf_transformer.layers.attention_bias import large_negative


def never_generated_bias(vocab_size: int):
  """float32 [vocab_size]: a large negative at PAD and BOS, which no output may contain."""
  return tf.tensor_scatter_nd_update(tf.zeros([vocab_size]), [[PAD_ID], [BOS_ID]],
                                     [large_negative(tf.float32)] * 2)


def decode(model, source_ids, config: DecodeConfig = DecodeConfig(), prefix_ids=None,
           shortlist=None, seeds=None, constraints=None):
  """The search of `config` (strategies.from_config) over the model's key/value-cached decoder.

  Args:
    model: a Transformer, or an ensemble.Ensemble (one search over the weighted mean of its
      members' log-probabilities).
    source_ids: int32 [batch, source_length], PAD_ID-padded, EOS-terminated.
    config: config.DecodeConfig: the strategy and its settings. Each sentence gets at most
      its source length (EOS included) + extra_decode_length target tokens (EOS included),
      whatever the batch it is in; with max_decode_length, that fixed number instead (with
      min_decode_length equal to it, every sentence gets exactly that many decoder steps).
    prefix_ids: optional int32 [batch, P], PAD_ID-padded: the first target tokens of each
      translation, forced (a row of PAD_IDs: none). A sentence with a prefix gets at most
      max(source length, prefix length) + extra tokens.
    shortlist: optional int32 [batch, n], each sentence's distinct target ids
      (tf_transformer.decoding.shortlist.select; EOS among them, and every id of its prefix): the only
      tokens its search may write. Each step computes the logits of a sentence's n ids alone
      (its columns of the output projection are gathered once), and its log-probabilities are
      normalised over them.
    seeds: int64 [batch], each sentence's seed for random sampling (default: config.seed +
      its row).
    constraints: optional lexical_constraints.Constraints (beam search only): the phrases each
      output must contain and must not contain (their tokens in the shortlist, if any). The
      positive tokens must fit before each sentence's limit (`output_limits`).

  Returns:
    ids: int32 [batch, N, L], best first, EOS then zeros; N is the beam size (1 for
      sampling); L is max_decode_length, or max(source_ids' width, prefix_ids' width) +
      extra_decode_length.
    scores: float32 [batch, N], length-normalized log-probabilities.
  """
  max_decode_length, buffer_length = output_limits(source_ids, config, prefix_ids)
  if seeds is None:
    seeds = config.seed + tf.range(tf.shape(source_ids)[0], dtype=tf.int64)
  members = ensemble.weighted_members(model)
  encoded = [member.encode(source_ids, training=False) for member, _ in members]
  caches = [member.init_decode_cache(memory, buffer_length, output_ids=shortlist)
            for (member, _), (memory, _) in zip(members, encoded)]
  forbidden = never_generated_bias(model.target_vocab_size)
  if shortlist is not None:
    forbidden = tf.gather(forbidden, shortlist)  # -> [batch, n]
    positions = shortlist_lib.vocabulary_positions(shortlist, model.target_vocab_size)
  # one model: its logits, which the search normalises; several: the weighted mean of their
  # log-probabilities, which it takes as they are (ensemble.py)
  gives_log_probs = len(members) > 1

  # the search state holds only the self-attention buffers; the rest (the projected memory,
  # one copy per source that its beam hypotheses share) stays constant
  def symbols_to_logits_fn(ids, step, self_caches):
    scores, new_self = None, []
    for (member, weight), (_, cross_bias), cache, self_cache in zip(members, encoded, caches,
                                                                    self_caches):
      logits, new_cache = member.decode_step(ids, step, cross_bias,
                                             dict(cache, self=self_cache), logits_bias=forbidden)
      if gives_log_probs:
        logits = weight * (logits - tf.reduce_logsumexp(logits, axis=-1, keepdims=True))
      scores = logits if scores is None else scores + logits
      new_self.append(new_cache["self"])
    if shortlist is not None:  # [B * K, n] -> [B * K, V]: the search sees the vocabulary
      scores = shortlist_lib.spread(scores, positions)
    return scores, tuple(new_self)

  search = strategies.from_config(config, constrained=constraints is not None)
  return search(symbols_to_logits_fn, tf.fill([tf.shape(source_ids)[0]], BOS_ID),
                tuple(cache["self"] for cache in caches), max_decode_length=max_decode_length,
                eos_id=EOS_ID, min_decode_length=config.min_decode_length,
                buffer_length=buffer_length, prefix_ids=prefix_ids, seeds=seeds,
                gives_log_probs=gives_log_probs, constraints=constraints)


def output_limits(source_ids, config: DecodeConfig, prefix_ids=None):
  """The most tokens (EOS included) of each sentence's output, and the width of the output ids.

  Args:
    source_ids: int32 [batch, source_length], PAD_ID-padded.
    config: its max_decode_length (fixed), else extra_decode_length.
    prefix_ids: optional int32 [batch, P], PAD_ID-padded forced prefixes.

  Returns:
    (limits, width): config.max_decode_length twice (Python ints) when it is set; else int32
    [batch] max(source length, prefix length) + extra_decode_length, and the widths'
    counterpart (a Python int when static).
  """
  if config.max_decode_length:
    return config.max_decode_length, config.max_decode_length
  width = _width(source_ids)
  limits = lengths(source_ids)  # -> [batch]
  if prefix_ids is not None:
    prefix_width = _width(prefix_ids)
    static = isinstance(width, int) and isinstance(prefix_width, int)
    width = (max if static else tf.maximum)(width, prefix_width)
    limits = tf.maximum(limits, lengths(prefix_ids))
  return limits + config.extra_decode_length, width + config.extra_decode_length


def _width(ids):
  """The width of ids [batch, width]: a Python int when static."""
  return ids.shape[1] if ids.shape[1] is not None else tf.shape(ids)[1]


def lengths(ids):
  """int32 [batch]: the tokens of each row of ids [batch, width] that are not PAD_ID."""
  return tf.reduce_sum(tf.cast(tf.not_equal(ids, PAD_ID), tf.int32), axis=1)


def attention(model, source_ids, target_ids):
  """The cross-attention weights behind a translation, e.g. `decode`'s best hypothesis.

  One teacher-forced pass over `target_ids`, which gives what the cached search computed
  (cached decoding equals full decoding), so the search itself pays nothing for them.

  Args:
    model: a Transformer, or an ensemble.Ensemble (its members' weights, weighted as their
      log-probabilities are).
    source_ids: int32 [batch, source_length], PAD_ID-padded, EOS-terminated.
    target_ids: int32 [batch, T], EOS then PAD_IDs (`decode`'s ids[:, 0]).

  Returns:
    float32 [batch, T, source_length]: the last decoder layer's weights averaged over heads,
    while the model predicts each target token; rows of real target tokens sum to 1 over the
    real source tokens, the other rows are zeros.
  """
  weights = _weighted_mean(model, lambda member: member.cross_attention_weights(
      decoder_inputs(target_ids), *member.encode(source_ids, training=False)))
  return tf.where(tf.not_equal(target_ids, PAD_ID)[:, :, tf.newaxis], weights, 0.0)


def _weighted_mean(model, fn):
  """fn(model) of a single model; the weighted sum of fn(member) over an Ensemble's members."""
  members = ensemble.weighted_members(model)
  if len(members) == 1:
    return fn(model)
  return tf.add_n([weight * fn(member) for member, weight in members])


def strip_after_eos(ids):
  """int32 [batch, length] -> ragged [batch, None] of the tokens before the first EOS."""
  is_eos = tf.equal(ids, EOS_ID)
  lengths = tf.where(tf.reduce_any(is_eos, axis=1),
                     tf.argmax(tf.cast(is_eos, tf.int32), axis=1, output_type=tf.int32),
                     tf.shape(ids)[1])
  return tf.RaggedTensor.from_tensor(ids, lengths=lengths)


def score(model, source_ids, target_ids, alpha: float = 0.0):
  """Forced decoding: the log-probability the model gives each target, as beam search scores it.

  Args:
    model: a Transformer, or an ensemble.Ensemble (the weighted mean of its members'
      log-probabilities, as its search scores).
    source_ids: int32 [batch, source_length], PAD_ID-padded, EOS-terminated.
    target_ids: int32 [batch, target_length], PAD_ID-padded, EOS-terminated.
    alpha: GNMT length-penalty exponent; 0 gives the raw log-probability.

  Returns:
    float32 [batch]: sum of log p(token | prefix, source) over the real target tokens (PAD and
    BOS excluded from the distribution, as in `decode`), over the length penalty.
  """
  real = tf.not_equal(target_ids, PAD_ID)

  def token_log_probs_of(member):  # -> [batch, length]
    logits = member((source_ids, decoder_inputs(target_ids)), training=False)
    log_probs = tf.nn.log_softmax(logits + never_generated_bias(member.target_vocab_size))
    return tf.gather(log_probs, target_ids, axis=2, batch_dims=2)

  token_log_probs = _weighted_mean(model, token_log_probs_of)
  total = tf.reduce_sum(tf.where(real, token_log_probs, 0.0), axis=1)
  lengths = tf.reduce_sum(tf.cast(real, tf.int32), axis=1)
  return total / search_ops.length_penalty(lengths, alpha)
