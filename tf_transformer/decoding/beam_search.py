"""Beam search over a `symbols_to_logits_fn`, in one tf.while_loop (it never imports a model).

Each step runs the logit filters (logit_filters.py), extends the live hypotheses by the
candidates of an `Expansion` (this module's `BeamExpansion`: the 2K best extensions of a
sentence; constrained_search.py's: those and the hypotheses that meet constraint tokens), keeps
K live ones by the expansion's rule, and moves those that ended to the finished set.

Sizes: B batch, K beam size, V vocabulary, L the width of the output ids, M candidates of a
sentence a step. With beam_size 1 it follows the argmax path but also keeps the best hypothesis
that ended on the way, so it may return a shorter output than plain greedy decoding when that
one scores better.
"""

from typing import NamedTuple

import tensorflow as tf

from tf_transformer.decoding import logit_filters
from tf_transformer.decoding.search_ops import (NEG_INF, expand_to_beam, flatten_beam,
                                                gather_beams, length_penalty, top_k_rows,
                                                unflatten_beam)


def _initial_state(initial_ids, initial_cache, batch, beam_size: int, buffer_length):
  """The loop state before the first step: one live empty hypothesis a sentence, none finished.

  Args:
    initial_ids: int32 [B], the start token of each sentence.
    initial_cache: nested structure of [B, ...] tensors.
    batch: int32 scalar, B.
    beam_size: K.
    buffer_length: L, int or int32 scalar.

  Returns:
    (step, last_ids, alive_ids, alive_log_probs, cache, finished_ids, finished_scores): int32
    scalar 0, int32 [B, K] (the start tokens), int32 [B, K, L] 0s, float32 [B, K], the cache
    as [B * K, ...] tensors, int32 [B, K, L] 0s, and float32 [B, K] (all -inf).
  """
  k = beam_size
  cache = tf.nest.map_structure(lambda t: flatten_beam(expand_to_beam(t, k)), initial_cache)
  alive_ids = tf.zeros([batch, k, buffer_length], tf.int32)
  # only the first copy of each sentence is live at step 0, or K copies would fill the beam
  alive_log_probs = tf.tile([[0.0] + [NEG_INF] * (k - 1)], [batch, 1])
  finished_ids = tf.zeros([batch, k, buffer_length], tf.int32)
  finished_scores = tf.fill([batch, k], NEG_INF)
  last_ids = expand_to_beam(initial_ids, k)  # -> [B, K]
  return (tf.constant(0), last_ids, alive_ids, alive_log_probs, cache, finished_ids,
          finished_scores)


def _sentences_done(step, limits, alive_log_probs, finished_scores, alpha: float):
  """bool [B]: past its limit, or no live hypothesis can still beat its worst finished one.

  Args:
    step: int32 scalar, the number of tokens of every hypothesis.
    limits: int32 [B], each sentence's maximum length.
    alive_log_probs: float32 [B, K], descending.
    finished_scores: float32 [B, K].
    alpha: length-penalty exponent.
  """
  best_possible = alive_log_probs[:, 0] / length_penalty(limits, alpha)
  worst_finished = tf.reduce_min(finished_scores, axis=1)
  return (best_possible < worst_finished) | (step >= limits)


class Best(NamedTuple):
  """The 2K best extensions of each sentence, and of each of its live hypotheses."""
  log_probs: tf.Tensor  # float32 [B, 2K], the sentence's, descending
  tokens: tf.Tensor  # int32 [B, 2K], their new tokens
  beams: tf.Tensor  # int32 [B, 2K], each one's parent among the K live hypotheses
  row_log_probs: tf.Tensor  # float32 [B, K, 2K], each hypothesis's, descending in a row
  row_tokens: tf.Tensor  # int32 [B, K, 2K]


class Setup(NamedTuple):
  """A search's constants, which every step reads."""
  batch: tf.Tensor  # int32 scalar, B
  beam_size: int  # K
  eos_id: int
  min_decode_length: tf.Tensor  # int32 scalar: no EOS before this many tokens
  buffer_length: object  # L, int or int32 scalar
  gives_log_probs: bool  # see `beam_search`
  filters: logit_filters.LogitFilters
  limits: tf.Tensor  # int32 [B], each sentence's maximum length (EOS included)


def next_logits(symbols_to_logits_fn, step, last_ids, alive_ids, cache, no_eos, setup: Setup,
                lexical=None):
  """Runs the decoder one step and filters what may not come next (setup.filters).

  Args:
    symbols_to_logits_fn: as in `beam_search`.
    step: int32 scalar, the position of the new token.
    last_ids: int32 [B, K], the last token of each live hypothesis.
    alive_ids: int32 [B, K, L], the live hypotheses (0s from `step` on).
    cache: nested structure of [B * K, ...] tensors, their decoder state.
    no_eos: bool scalar or [B * K, 1]: the rows where EOS may not come yet.
    setup: the search's Setup.
    lexical: a constrained search's lexical_constraints.State of the live hypotheses.

  Returns:
    allowed: float32 [B * K, V], the filtered logits, NEG_INF where a token may not come.
    normaliser: float32 [B * K, 1], what turns a logit into a log-probability (0.0 when
      gives_log_probs).
    cache: the state after `step`, by parent.
  """
  logits, cache = symbols_to_logits_fn(tf.reshape(last_ids, [-1]), step, cache)
  logits = tf.cast(logits, tf.float32)  # -> [B * K, V]
  context = logit_filters.context(setup.filters, step, lambda: flatten_beam(alive_ids),
                                  no_eos, lexical)
  logits = setup.filters.transform(logits, context)
  allowed = setup.filters.mask(logits, context)
  normaliser = 0.0
  if not setup.gives_log_probs:
    normaliser = tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
  return allowed, normaliser, cache


def best_extensions(allowed, normaliser, alive_log_probs, batch, beam_size: int) -> Best:
  """The 2K best extensions of each sentence (see `BeamExpansion`), from `next_logits`'s
  `allowed` [B * K, V] and `normaliser`, and the live hypotheses' log-probabilities [B, K].

  The 2K best of a sentence are among the 2K best of each of its hypotheses, so each row is
  cut to its 2K best first, and normalised (a shift of a row) alone.
  """
  k = beam_size
  per_row = min(2 * k, allowed.shape[-1] or 2 * k)  # all of a vocabulary smaller than 2K
  row_logits, row_tokens = top_k_rows(allowed, per_row)  # -> [B * K, 2K]
  row_log_probs = unflatten_beam(row_logits - normaliser, batch, k)  # -> [B, K, 2K]
  row_log_probs += alive_log_probs[:, :, tf.newaxis]
  flat = tf.reshape(row_log_probs, [batch, -1])  # -> [B, K * 2K]
  log_probs, indices = tf.math.top_k(flat, k=2 * k)  # -> [B, 2K]
  row_tokens = unflatten_beam(row_tokens, batch, k)  # -> [B, K, 2K]
  tokens = tf.gather(tf.reshape(row_tokens, [batch, -1]), indices, batch_dims=1)
  return Best(log_probs, tokens, indices // per_row, row_log_probs, row_tokens)


def _extended_ids(alive_ids, beams, tokens, step, buffer_length):
  """int32 [B, M, L]: the parents `beams` [B, M] of `alive_ids` [B, K, L] with `tokens`
  [B, M] at position `step`."""
  position = tf.one_hot(step, buffer_length, dtype=tf.int32)  # -> [L]
  return gather_beams(alive_ids, beams) + tokens[:, :, tf.newaxis] * position


def extended_ids(alive_ids, beams, tokens, step, buffer_length):
  """int32 [B, M, L]: the parents `beams` [B, M] of `alive_ids` [B, K, L] with `tokens`
  [B, M] at position `step`."""
  position = tf.one_hot(step, buffer_length, dtype=tf.int32)  # -> [L]
  return gather_beams(alive_ids, beams) + tokens[:, :, tf.newaxis] * position


class BeamExpansion:
  """The candidates of beam search: each sentence's 2K best extensions (even if K of them end
  in EOS, K live ones remain), the K best that did not end kept live. It carries no state."""

  def constraint_masks(self, beam_size: int) -> tuple:
    """The logit filters of its own (none)."""
    del beam_size
    return ()

  def initial_state(self, beam_size: int) -> tuple:
    """Its state of the first live hypotheses (none)."""
    del beam_size
    return ()

  def grow(self, symbols_to_logits_fn, step, last_ids, alive_ids, alive_log_probs, cache,
           state, setup: Setup):
    """Extends each live hypothesis by one token: the M candidates of each sentence.

    Args:
      symbols_to_logits_fn: as in `beam_search`.
      step: int32 scalar, the position of the new token.
      last_ids, alive_ids, alive_log_probs, cache: the live hypotheses ([B, K], [B, K, L],
        [B, K], [B * K, ...]).
      state: the expansion's state of the live hypotheses.
      setup: the search's Setup.

    Returns:
      top_ids: int32 [B, M, L], the candidates: their parent's tokens and the new one.
      top_log_probs: float32 [B, M], their log-probabilities (NEG_INF: none).
      top_tokens: int32 [B, M], their new tokens.
      top_beams: int32 [B, M], each one's parent among the K live hypotheses.
      state: the expansion's state of the candidates.
      cache: nested structure of [B * K, ...] tensors, the state after `step`, by parent.
    """
    del state
    allowed, normaliser, cache = next_logits(
        symbols_to_logits_fn, step, last_ids, alive_ids, cache,
        step + 1 < setup.min_decode_length, setup)
    best = best_extensions(allowed, normaliser, alive_log_probs, setup.batch, setup.beam_size)
    top_ids = extended_ids(alive_ids, best.beams, best.tokens, step, setup.buffer_length)
    return top_ids, best.log_probs, best.tokens, best.beams, (), cache

  def keep(self, alive_candidates, state, beam_size: int):
    """int32 [B, K]: the candidates that live on, of their log-probabilities [B, M] (NEG_INF
    for those that ended): the K best."""
    del state
    return tf.math.top_k(alive_candidates, k=beam_size)[1]


def take_alive(keep, top_ids, top_log_probs, top_tokens, top_beams, cache, batch,
                beam_size: int):
  """The candidates `keep` (int32 [B, K] indices into M) as the new live hypotheses: their
  last tokens [B, K], tokens [B, K, L], log-probabilities [B, K] (`top_log_probs` with NEG_INF
  at the candidates that ended) and cache (candidates as `Expansion.grow` returns them, M of them)."""
  alive_ids = gather_beams(top_ids, keep)
  alive_log_probs = gather_beams(top_log_probs, keep)
  last_ids = gather_beams(top_tokens, keep)
  parents = gather_beams(top_beams, keep)  # -> [B, K], indices into the old K
  cache = tf.nest.map_structure(  # [B * K, ...] -> [B, K, ...] -> [B * K, ...]
      lambda t: flatten_beam(gather_beams(unflatten_beam(t, batch, beam_size), parents)),
      cache)
  return last_ids, alive_ids, alive_log_probs, cache


def _merge_finished(finished_ids, finished_scores, top_ids, top_log_probs, ends, step,
                    alpha: float, beam_size: int):
  """Merges the candidates that ended with the K finished so far and keeps the K best.

  Args:
    finished_ids: int32 [B, K, L], the finished hypotheses so far.
    finished_scores: float32 [B, K], their normalized log-probabilities (-inf: none).
    top_ids: int32 [B, M, L], the candidates of `Expansion.grow`.
    top_log_probs: float32 [B, M], their log-probabilities.
    ends: bool [B, M], whether each candidate ends in EOS.
    step: int32 scalar, the position of the candidates' last token.
    alpha: length-penalty exponent.
    beam_size: K.

  Returns:
    finished_ids: int32 [B, K, L], the K best finished hypotheses.
    finished_scores: float32 [B, K], their scores, descending.
  """
  new_scores = tf.where(ends, top_log_probs / length_penalty(step + 1, alpha), NEG_INF)
  scores = tf.concat([finished_scores, new_scores], axis=1)  # -> [B, K + M]
  finished_scores, keep = tf.math.top_k(scores, k=beam_size)
  finished_ids = gather_beams(tf.concat([finished_ids, top_ids], axis=1), keep)
  return finished_ids, finished_scores


def _keep_frozen(frozen, new, old):
  """Each tensor of `new`, with the rows of the `frozen` sentences (bool [B]) taken from the
  tensor of `old` in its place (both [B, ...])."""
  return tuple(tf.where(tf.reshape(frozen, [-1] + [1] * (n.shape.rank - 1)), o, n)
               for n, o in zip(new, old))


def _best_hypotheses(finished_ids, finished_scores, alive_ids, alive_log_probs, limits,
                     alpha: float, batch, beam_size: int):
  """The K best finished hypotheses of each sentence, completed by its best live ones.

  Args:
    finished_ids: int32 [B, K, L], the finished hypotheses.
    finished_scores: float32 [B, K], their scores (-inf: none).
    alive_ids: int32 [B, K, L], the live hypotheses.
    alive_log_probs: float32 [B, K], their log-probabilities.
    limits: int32 [B], each sentence's maximum length, the live ones' penalty length.
    alpha: length-penalty exponent.
    batch: int32 scalar, B.
    beam_size: K.

  Returns:
    ids: int32 [B, K, L], the tokens of each hypothesis, best first.
    scores: float32 [B, K], their normalized log-probabilities, descending.
  """
  k = beam_size
  alive_scores = alive_log_probs / length_penalty(limits[:, tf.newaxis], alpha)
  scores = tf.concat([finished_scores, alive_scores], axis=1)  # -> [B, 2K]
  ids = tf.concat([finished_ids, alive_ids], axis=1)  # -> [B, 2K, L]
  is_finished = tf.concat([tf.fill([batch, k], True), tf.fill([batch, k], False)], axis=1)
  # finished ones first (a live hypothesis is only a stand-in), then by score
  rank = tf.where(is_finished & (scores > NEG_INF / 2), scores, scores + 2 * NEG_INF)
  _, order = tf.math.top_k(rank, k=k)
  return gather_beams(ids, order), gather_beams(scores, order)


def beam_search(symbols_to_logits_fn, initial_ids, initial_cache, beam_size: int, alpha: float,
                max_decode_length, eos_id: int, min_decode_length=0, buffer_length=None,
                prefix_ids=None, gives_log_probs: bool = False,
                repetition: logit_filters.RepetitionControls = logit_filters.RepetitionControls(),
                expansion=None):
  """Finds the `beam_size` best sequences under a GNMT-normalized log-probability.

  Every step expands each live hypothesis, keeps the 2K best extensions (at most K of them end
  in EOS, so K live ones always remain), moves the EOS-ending ones to a finished set scored by
  log_prob / length_penalty, and keeps the K best live and K best finished. The loop ends at
  `max_decode_length` or when no live hypothesis can still beat the worst finished one of its
  sentence (log-probabilities only fall, so a live hypothesis's best possible score is its
  log-probability over the largest penalty, reached at max length when alpha >= 0).
  Each sentence has its own maximum length: past it, its hypotheses stay as they are while
  the others go on, so a sentence's result does not depend on the batch it is decoded in.

  Args:
    symbols_to_logits_fn: fn(ids [B * K], step int32 scalar, cache) -> (logits float32
      [B * K, V], cache): the next-token logits after `ids`, the token at position `step`.
    initial_ids: int32 [B], the start token of each sentence.
    initial_cache: nested structure of [B, ...] tensors (expanded to [B * K, ...] here).
    beam_size: K >= 1.
    alpha: length-penalty exponent (0: raw log-probabilities).
    max_decode_length: int32 scalar or [B], at most this many tokens (EOS included).
    eos_id: end-of-sentence id.
    min_decode_length: EOS cannot be produced before this many tokens (EOS included).
    buffer_length: L, the width of the output ids (>= every max_decode_length; required when
      that is a tensor). A static L lets XLA compile one search for many limits.
    prefix_ids: optional int32 [B, P]: each sentence's first tokens, forced (0-padded; a row
      of 0s forces nothing). Each is scored with the model's log-probability, as a forced
      decoding scores it, and the search goes on from the end of the prefix. A prefix longer
      than its sentence's limit is cut there.
    gives_log_probs: symbols_to_logits_fn gives the log-probabilities to score with (an
      ensemble's weighted mean of log-softmax, not renormalised), not logits to normalise.
    repetition: logit_filters.RepetitionControls, the repeats the search avoids.
    expansion: the candidates of each step and which live on: BeamExpansion (default), or
      constrained_search.ConstrainedExpansion.

  Returns:
    ids: int32 [B, K, L], the tokens of each hypothesis, best first; EOS included, then 0s.
    scores: float32 [B, K], their normalized log-probabilities, sorted descending. A sentence
      with fewer than K finished hypotheses is completed with its best live ones.
  """
  batch = tf.shape(initial_ids)[0]
  if buffer_length is None:
    buffer_length = max_decode_length
  limits = tf.broadcast_to(tf.convert_to_tensor(max_decode_length, tf.int32), [batch])  # [B]
  k = beam_size
  expansion = expansion or BeamExpansion()
  filters = logit_filters.for_search(eos_id, k, prefix_ids, repetition,
                                     expansion.constraint_masks(k))
  setup = Setup(batch, k, eos_id, tf.convert_to_tensor(min_decode_length, tf.int32),
                buffer_length, gives_log_probs, filters, limits)

  def not_done(step, last_ids, alive_ids, alive_log_probs, cache, finished_ids,
               finished_scores, state):
    done = _sentences_done(step, limits, alive_log_probs, finished_scores, alpha)
    return tf.logical_not(tf.reduce_all(done))

  def body(*loop_state):
    # gathers and reshapes lose static dims; the loop needs each state's shape kept
    return tf.nest.map_structure(lambda new, old: tf.ensure_shape(new, old.shape),
                                 step_once(*loop_state), loop_state)

  def step_once(step, last_ids, alive_ids, alive_log_probs, cache, finished_ids,
                finished_scores, state):
    frozen = step >= limits  # [B]: these sentences keep their hypotheses as they are
    old = (alive_ids, alive_log_probs, finished_ids, finished_scores, *state)
    top_ids, top_log_probs, top_tokens, top_beams, top_state, cache = expansion.grow(
        symbols_to_logits_fn, step, last_ids, alive_ids, alive_log_probs, cache, state, setup)
    # a candidate masked out (a forced step, or EOS before min_decode_length) only fills the
    # places: it never counts as finished
    ends = tf.equal(top_tokens, eos_id) & (top_log_probs > NEG_INF / 2)
    alive_candidates = tf.where(ends, NEG_INF, top_log_probs)
    keep = expansion.keep(alive_candidates, top_state, k)
    last_ids, alive_ids, alive_log_probs, cache = take_alive(
        keep, top_ids, alive_candidates, top_tokens, top_beams, cache, batch, k)
    state = type(top_state)(*(gather_beams(t, keep) for t in top_state))
    finished_ids, finished_scores = _merge_finished(
        finished_ids, finished_scores, top_ids, top_log_probs, ends, step, alpha, k)
    alive_ids, alive_log_probs, finished_ids, finished_scores, *kept = _keep_frozen(
        frozen, (alive_ids, alive_log_probs, finished_ids, finished_scores, *state), old)
    return (step + 1, last_ids, alive_ids, alive_log_probs, cache, finished_ids,
            finished_scores, type(state)(*kept))

  loop_state = (*_initial_state(initial_ids, initial_cache, batch, k, buffer_length),
                expansion.initial_state(k))
  _, _, alive_ids, alive_log_probs, _, finished_ids, finished_scores, _ = tf.while_loop(
      not_done, body, loop_state)
  return _best_hypotheses(finished_ids, finished_scores, alive_ids, alive_log_probs, limits,
                          alpha, batch, k)
