"""Beam search over a `symbols_to_logits_fn`, in one tf.while_loop (it never imports a model).

Sizes: B batch, K beam size, V vocabulary, L the width of the output ids. With beam_size 1 it
follows the argmax path but also keeps the best hypothesis that ended on the way, so it may
return a shorter output than plain greedy decoding when that one scores better.
"""

from typing import NamedTuple

import tensorflow as tf

from tf_transformer.decoding import lexical_constraints
from tf_transformer.decoding.search_ops import NEG_INF, force_prefix, length_penalty, top_k_rows


def _flatten_beam(x):
  """[B, K, ...] -> [B * K, ...]."""
  shape = tf.shape(x)
  return tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], axis=0))


def _unflatten_beam(x, batch, beam_size):
  """[B * K, ...] -> [B, K, ...]."""
  return tf.reshape(x, tf.concat([[batch, beam_size], tf.shape(x)[1:]], axis=0))


def _expand_to_beam(x, beam_size):
  """[B, ...] -> [B, K, ...] by repeating each row."""
  x = tf.expand_dims(x, 1)
  multiples = tf.concat([[1, beam_size], tf.ones([tf.rank(x) - 2], tf.int32)], axis=0)
  return tf.tile(x, multiples)


def _gather_beams(x, indices):
  """x [B, N, ...], indices [B, M] into axis 1 -> [B, M, ...]."""
  return tf.gather(x, indices, axis=1, batch_dims=1)


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
  cache = tf.nest.map_structure(lambda t: _flatten_beam(_expand_to_beam(t, k)), initial_cache)
  alive_ids = tf.zeros([batch, k, buffer_length], tf.int32)
  # only the first copy of each sentence is live at step 0, or K copies would fill the beam
  alive_log_probs = tf.tile([[0.0] + [NEG_INF] * (k - 1)], [batch, 1])
  finished_ids = tf.zeros([batch, k, buffer_length], tf.int32)
  finished_scores = tf.fill([batch, k], NEG_INF)
  last_ids = _expand_to_beam(initial_ids, k)  # -> [B, K]
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


class _Best(NamedTuple):
  """The 2K best extensions of each sentence, and of each of its live hypotheses."""
  log_probs: tf.Tensor  # float32 [B, 2K], the sentence's, descending
  tokens: tf.Tensor  # int32 [B, 2K], their new tokens
  beams: tf.Tensor  # int32 [B, 2K], each one's parent among the K live hypotheses
  row_log_probs: tf.Tensor  # float32 [B, K, 2K], each hypothesis's, descending in a row
  row_tokens: tf.Tensor  # int32 [B, K, 2K]


def _next_logits(symbols_to_logits_fn, step, last_ids, cache, no_eos, *, beam_size: int,
                 eos_id: int, prefix_ids=None, gives_log_probs: bool = False, mask=None):
  """Runs the decoder one step and masks what may not come next.

  Args:
    symbols_to_logits_fn, step, last_ids, cache, beam_size, eos_id, prefix_ids,
      gives_log_probs: as in `_grow_alive`.
    no_eos: bool scalar or [B * K, 1]: the rows where EOS may not come yet.
    mask: optional fn(logits [B * K, V]) -> logits, further masks (before the prefix's).

  Returns:
    allowed: float32 [B * K, V], the logits with NEG_INF where a token may not come.
    normaliser: float32 [B * K, 1], what turns a logit into a log-probability (0.0 when
      gives_log_probs).
    cache: the state after `step`, by parent.
  """
  logits, cache = symbols_to_logits_fn(tf.reshape(last_ids, [-1]), step, cache)
  logits = tf.cast(logits, tf.float32)  # -> [B * K, V]
  is_eos = tf.equal(tf.range(tf.shape(logits)[-1]), eos_id)[tf.newaxis]
  # past min_decode_length, with no constraint unmet, there is nothing to mask: skip a pass
  allowed = tf.cond(tf.reduce_any(no_eos), lambda: tf.where(no_eos & is_eos, NEG_INF, logits),
                    lambda: logits)
  if mask is not None:
    allowed = mask(allowed)
  if prefix_ids is not None:
    allowed = force_prefix(allowed, prefix_ids, step, beam_size)
  normaliser = 0.0
  if not gives_log_probs:
    normaliser = tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
  return allowed, normaliser, cache


def _best_extensions(allowed, normaliser, alive_log_probs, batch, beam_size: int) -> _Best:
  """The 2K best extensions of each sentence (see `_grow_alive`), from `_next_logits`'s
  `allowed` [B * K, V] and `normaliser`, and the live hypotheses' log-probabilities [B, K].

  The 2K best of a sentence are among the 2K best of each of its hypotheses, so each row is
  cut to its 2K best first, and normalised (a shift of a row) alone.
  """
  k = beam_size
  per_row = min(2 * k, allowed.shape[-1] or 2 * k)  # all of a vocabulary smaller than 2K
  row_logits, row_tokens = top_k_rows(allowed, per_row)  # -> [B * K, 2K]
  row_log_probs = _unflatten_beam(row_logits - normaliser, batch, k)  # -> [B, K, 2K]
  row_log_probs += alive_log_probs[:, :, tf.newaxis]
  flat = tf.reshape(row_log_probs, [batch, -1])  # -> [B, K * 2K]
  log_probs, indices = tf.math.top_k(flat, k=2 * k)  # -> [B, 2K]
  row_tokens = _unflatten_beam(row_tokens, batch, k)  # -> [B, K, 2K]
  tokens = tf.gather(tf.reshape(row_tokens, [batch, -1]), indices, batch_dims=1)
  return _Best(log_probs, tokens, indices // per_row, row_log_probs, row_tokens)


def _extended_ids(alive_ids, beams, tokens, step, buffer_length):
  """int32 [B, M, L]: the parents `beams` [B, M] of `alive_ids` [B, K, L] with `tokens`
  [B, M] at position `step`."""
  position = tf.one_hot(step, buffer_length, dtype=tf.int32)  # -> [L]
  return _gather_beams(alive_ids, beams) + tokens[:, :, tf.newaxis] * position


def _grow_alive(symbols_to_logits_fn, step, last_ids, alive_ids, alive_log_probs, cache, *,
                batch, beam_size: int, eos_id: int, min_decode_length, buffer_length,
                prefix_ids=None, gives_log_probs: bool = False):
  """Extends each live hypothesis by one token and keeps the 2K best extensions of a sentence.

  2K: even if K of them end in EOS, K live ones remain.

  Args:
    symbols_to_logits_fn: as in `beam_search`.
    step: int32 scalar, the position of the new token.
    last_ids: int32 [B, K], the last token of each live hypothesis.
    alive_ids: int32 [B, K, L], the live hypotheses (0s from `step` on).
    alive_log_probs: float32 [B, K], their log-probabilities.
    cache: nested structure of [B * K, ...] tensors, the live hypotheses' decoder state.
    batch: int32 scalar, B.
    beam_size: K.
    eos_id: end-of-sentence id.
    min_decode_length: int32 scalar: EOS cannot be produced before this many tokens.
    buffer_length: L.
    prefix_ids: optional int32 [B, P], tokens forced at the first steps (see `beam_search`).
    gives_log_probs: see `beam_search`.

  Returns:
    top_ids: int32 [B, 2K, L], the candidates: their parent's tokens and the new one.
    top_log_probs: float32 [B, 2K], their log-probabilities, descending.
    top_tokens: int32 [B, 2K], their new tokens.
    top_beams: int32 [B, 2K], the index of each one's parent among the K live hypotheses.
    cache: nested structure of [B * K, ...] tensors, the state after `step`, by parent.
  """
  allowed, normaliser, cache = _next_logits(
      symbols_to_logits_fn, step, last_ids, cache, step + 1 < min_decode_length,
      beam_size=beam_size, eos_id=eos_id, prefix_ids=prefix_ids,
      gives_log_probs=gives_log_probs)
  best = _best_extensions(allowed, normaliser, alive_log_probs, batch, beam_size)
  top_ids = _extended_ids(alive_ids, best.beams, best.tokens, step, buffer_length)
  return top_ids, best.log_probs, best.tokens, best.beams, cache


def _grow_constrained(symbols_to_logits_fn, step, last_ids, alive_ids, alive_log_probs, cache,
                      state, constraints, limits, *, batch, beam_size: int, eos_id: int,
                      min_decode_length, buffer_length, prefix_ids=None,
                      gives_log_probs: bool = False):
  """`_grow_alive` under lexical constraints: the candidates are the 2K best extensions of a
  sentence, each live hypothesis's best extension, and each live hypothesis extended by each
  constraint token it may meet next (lexical_constraints.allowed_tokens), M = 3K + K * C in
  all (Post & Vilar's three kinds).

  EOS is masked until a hypothesis has met every positive token, a token that completes a
  negative phrase always; a candidate is dropped (NEG_INF) when it repeats another or leaves
  more tokens to meet than its sentence has places left before EOS.

  Args (beyond `_grow_alive`'s):
    state: lexical_constraints.State of the live hypotheses ([B, K, C], [B, K], [B, K]).
    constraints: lexical_constraints.Constraints of the batch.
    limits: int32 [B], each sentence's maximum length (EOS included).

  Returns:
    top_ids: int32 [B, M, L]; top_log_probs: float32 [B, M] (NEG_INF: dropped); top_tokens,
    top_beams: int32 [B, M]; the candidates' lexical_constraints.State ([B, M, C], [B, M] x 2);
    cache as `_grow_alive`'s.
  """
  k = beam_size
  unmet = lexical_constraints.unmet(constraints, state)  # -> [B, K]
  no_eos = tf.reshape((unmet > 0) | (step + 1 < min_decode_length), [-1, 1])

  def mask(logits):
    logits = lexical_constraints.banned_logits(logits, constraints, alive_ids, step, k)
    return lexical_constraints.after_phrase_logits(logits, constraints, state)

  allowed, normaliser, cache = _next_logits(
      symbols_to_logits_fn, step, last_ids, cache, no_eos, beam_size=k, eos_id=eos_id,
      prefix_ids=prefix_ids, gives_log_probs=gives_log_probs, mask=mask)
  best = _best_extensions(allowed, normaliser, alive_log_probs, batch, k)
  # each live hypothesis's own best next token: the 2K best of a sentence may all extend the
  # likeliest hypotheses, and a hypothesis of a bank that met more tokens would die out
  own_log_probs = best.row_log_probs[:, :, 0]  # -> [B, K]
  own_tokens = best.row_tokens[:, :, 0]
  # each live hypothesis followed by each constraint token: [B, K, C] -> [B, K * C]
  count = tf.shape(constraints.tokens)[1]
  tokens = tf.broadcast_to(constraints.tokens[:, tf.newaxis], [batch, k, count])
  normalised = _unflatten_beam(allowed - normaliser, batch, k)  # -> [B, K, V]
  met_log_probs = tf.gather(normalised, tokens, batch_dims=2) + alive_log_probs[:, :, tf.newaxis]
  met_log_probs = tf.where(lexical_constraints.allowed_tokens(constraints, state),
                           met_log_probs, NEG_INF)
  met_beams = tf.broadcast_to(tf.range(k)[:, tf.newaxis], [k, count])
  top_log_probs = tf.concat([best.log_probs, own_log_probs,
                             tf.reshape(met_log_probs, [batch, -1])], axis=1)
  top_tokens = tf.concat([best.tokens, own_tokens, tf.reshape(tokens, [batch, -1])], axis=1)
  top_beams = tf.concat([best.beams, tf.broadcast_to(tf.range(k), [batch, k]),
                         tf.broadcast_to(tf.reshape(met_beams, [1, -1]), [batch, k * count])],
                        axis=1)
  valid = top_log_probs > NEG_INF / 2  # -> [B, M]
  # a constraint token among a hypothesis's 2K best, or in two of its phrases: one candidate
  key = top_beams * tf.shape(allowed)[-1] + top_tokens
  places = tf.range(tf.shape(key)[1])
  earlier = places[tf.newaxis, :] < places[:, tf.newaxis]  # -> [M, M]: j before i
  repeats = tf.reduce_any(tf.equal(key[:, :, tf.newaxis], key[:, tf.newaxis, :])
                          & earlier & valid[:, tf.newaxis, :], axis=-1)
  parent_state = lexical_constraints.State(*(_gather_beams(t, top_beams) for t in state))
  new_state = lexical_constraints.advance(constraints, parent_state, top_tokens)
  # places left for tokens before EOS, after this one (a hypothesis cut at its limit must
  # have met every token by then too)
  places_left = tf.maximum(limits - 2 - step, 0)[:, tf.newaxis]
  fits = lexical_constraints.unmet(constraints, new_state) <= places_left
  top_log_probs = tf.where(valid & tf.logical_not(repeats) & fits, top_log_probs, NEG_INF)
  top_ids = _extended_ids(alive_ids, top_beams, top_tokens, step, buffer_length)
  return top_ids, top_log_probs, top_tokens, top_beams, new_state, cache


def _choose_alive(top_ids, top_log_probs, top_tokens, top_beams, ends, cache, batch,
                  beam_size: int):
  """The K best candidates that did not end: the new live hypotheses.

  Args:
    top_ids: int32 [B, 2K, L], the candidates of `_grow_alive`.
    top_log_probs: float32 [B, 2K], their log-probabilities.
    top_tokens: int32 [B, 2K], their last tokens.
    top_beams: int32 [B, 2K], the index of each one's parent among the K old live ones.
    ends: bool [B, 2K], whether each candidate ends in EOS.
    cache: nested structure of [B * K, ...] tensors, in the order of the old live ones.
    batch: int32 scalar, B.
    beam_size: K.

  Returns:
    last_ids: int32 [B, K], the new tokens of the new live hypotheses.
    alive_ids: int32 [B, K, L], their tokens.
    alive_log_probs: float32 [B, K], their log-probabilities, descending.
    cache: nested structure of [B * K, ...] tensors, in their order.
  """
  alive_candidates = tf.where(ends, NEG_INF, top_log_probs)
  _, keep = tf.math.top_k(alive_candidates, k=beam_size)  # -> [B, K]
  return _take_alive(keep, top_ids, alive_candidates, top_tokens, top_beams, cache, batch,
                     beam_size)


def _take_alive(keep, top_ids, top_log_probs, top_tokens, top_beams, cache, batch,
                beam_size: int):
  """The candidates `keep` (int32 [B, K] indices into M) as the new live hypotheses: their
  last tokens [B, K], tokens [B, K, L], log-probabilities [B, K] (`top_log_probs` with NEG_INF
  at the candidates that ended) and cache (candidates as in `_choose_alive`, M of them)."""
  alive_ids = _gather_beams(top_ids, keep)
  alive_log_probs = _gather_beams(top_log_probs, keep)
  last_ids = _gather_beams(top_tokens, keep)
  parents = _gather_beams(top_beams, keep)  # -> [B, K], indices into the old K
  cache = tf.nest.map_structure(  # [B * K, ...] -> [B, K, ...] -> [B * K, ...]
      lambda t: _flatten_beam(_gather_beams(_unflatten_beam(t, batch, beam_size), parents)),
      cache)
  return last_ids, alive_ids, alive_log_probs, cache


def _merge_finished(finished_ids, finished_scores, top_ids, top_log_probs, ends, step,
                    alpha: float, beam_size: int):
  """Merges the candidates that ended with the K finished so far and keeps the K best.

  Args:
    finished_ids: int32 [B, K, L], the finished hypotheses so far.
    finished_scores: float32 [B, K], their normalized log-probabilities (-inf: none).
    top_ids: int32 [B, 2K, L], the candidates of `_grow_alive`.
    top_log_probs: float32 [B, 2K], their log-probabilities.
    ends: bool [B, 2K], whether each candidate ends in EOS.
    step: int32 scalar, the position of the candidates' last token.
    alpha: length-penalty exponent.
    beam_size: K.

  Returns:
    finished_ids: int32 [B, K, L], the K best finished hypotheses.
    finished_scores: float32 [B, K], their scores, descending.
  """
  new_scores = tf.where(ends, top_log_probs / length_penalty(step + 1, alpha), NEG_INF)
  scores = tf.concat([finished_scores, new_scores], axis=1)  # -> [B, 3K]
  finished_scores, keep = tf.math.top_k(scores, k=beam_size)
  finished_ids = _gather_beams(tf.concat([finished_ids, top_ids], axis=1), keep)
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
  return _gather_beams(ids, order), _gather_beams(scores, order)


def beam_search(symbols_to_logits_fn, initial_ids, initial_cache, beam_size: int, alpha: float,
                max_decode_length, eos_id: int, min_decode_length=0, buffer_length=None,
                prefix_ids=None, gives_log_probs: bool = False, constraints=None):
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
    constraints: optional lexical_constraints.Constraints: every hypothesis returned contains
      each positive phrase of its sentence and no negative one (dynamic beam allocation, see
      lexical_constraints). The positive tokens must fit before each sentence's limit (the
      caller checks); a sentence whose hypotheses cannot meet them gets scores below NEG_INF / 2.

  Returns:
    ids: int32 [B, K, L], the tokens of each hypothesis, best first; EOS included, then 0s.
    scores: float32 [B, K], their normalized log-probabilities, sorted descending. A sentence
      with fewer than K finished hypotheses is completed with its best live ones.
  """
  batch = tf.shape(initial_ids)[0]
  if buffer_length is None:
    buffer_length = max_decode_length
  limits = tf.broadcast_to(tf.convert_to_tensor(max_decode_length, tf.int32), [batch])  # [B]
  min_decode_length = tf.convert_to_tensor(min_decode_length, tf.int32)
  k = beam_size

  def not_done(step, last_ids, alive_ids, alive_log_probs, cache, finished_ids,
               finished_scores, lexical):
    done = _sentences_done(step, limits, alive_log_probs, finished_scores, alpha)
    return tf.logical_not(tf.reduce_all(done))

  def body(*state):
    # gathers and reshapes lose static dims; the loop needs each state's shape kept
    return tf.nest.map_structure(lambda new, old: tf.ensure_shape(new, old.shape),
                                 step_once(*state), state)

  def step_once(step, last_ids, alive_ids, alive_log_probs, cache, finished_ids,
                finished_scores, lexical):
    frozen = step >= limits  # [B]: these sentences keep their hypotheses as they are
    old = (alive_ids, alive_log_probs, finished_ids, finished_scores, *lexical)
    grow = dict(batch=batch, beam_size=k, eos_id=eos_id, min_decode_length=min_decode_length,
                buffer_length=buffer_length, prefix_ids=prefix_ids,
                gives_log_probs=gives_log_probs)
    if constraints is None:
      top_ids, top_log_probs, top_tokens, top_beams, cache = _grow_alive(
          symbols_to_logits_fn, step, last_ids, alive_ids, alive_log_probs, cache, **grow)
    else:
      top_ids, top_log_probs, top_tokens, top_beams, top_lexical, cache = _grow_constrained(
          symbols_to_logits_fn, step, last_ids, alive_ids, alive_log_probs, cache, lexical,
          constraints, limits, **grow)
    # a candidate masked out (a forced step, or EOS before min_decode_length) only fills the 2K
    # places: it never counts as finished
    ends = tf.equal(top_tokens, eos_id) & (top_log_probs > NEG_INF / 2)
    if constraints is None:
      last_ids, alive_ids, alive_log_probs, cache = _choose_alive(
          top_ids, top_log_probs, top_tokens, top_beams, ends, cache, batch, k)
    else:
      alive_candidates = tf.where(ends, NEG_INF, top_log_probs)
      keep = lexical_constraints.banked_top_k(alive_candidates,
                                              lexical_constraints.met_count(top_lexical), k)
      last_ids, alive_ids, alive_log_probs, cache = _take_alive(
          keep, top_ids, alive_candidates, top_tokens, top_beams, cache, batch, k)
      lexical = lexical_constraints.State(*(_gather_beams(t, keep) for t in top_lexical))
    finished_ids, finished_scores = _merge_finished(
        finished_ids, finished_scores, top_ids, top_log_probs, ends, step, alpha, k)
    alive_ids, alive_log_probs, finished_ids, finished_scores, *kept = _keep_frozen(
        frozen, (alive_ids, alive_log_probs, finished_ids, finished_scores, *lexical), old)
    return (step + 1, last_ids, alive_ids, alive_log_probs, cache, finished_ids,
            finished_scores, type(lexical)(*kept))

  lexical = () if constraints is None else lexical_constraints.initial_state(constraints, k)
  state = (*_initial_state(initial_ids, initial_cache, batch, k, buffer_length), lexical)
  _, _, alive_ids, alive_log_probs, _, finished_ids, finished_scores, _ = tf.while_loop(
      not_done, body, state)
  return _best_hypotheses(finished_ids, finished_scores, alive_ids, alive_log_probs, limits,
                          alpha, batch, k)
