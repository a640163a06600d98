"""Lexical constraints for beam search: target phrases every output must contain (positive) or
must never contain (negative), as tensors a compiled search can carry.

The positive phrases of a sentence are one row of C token ids, the phrases one after another;
`continues` marks the tokens followed by the next one of the same phrase. Each hypothesis
carries which of them it has met and the next token of a phrase it is in the middle of (Post &
Vilar 2018, "dynamic beam allocation"; vectorized after Hu et al. 2019): a token that starts an
unmet phrase meets it; a phrase begun must go on with its next token, or what it met of the
phrase is given back. A phrase counts once met in full, so an output that meets every token
contains every phrase. The search keeps K hypotheses in banks by the number of tokens met
(`banked_top_k`), so hypotheses that have begun to meet the constraints are not crowded out
by the likelier ones that have not.

Sizes: B batch, K beam size, M candidates of a sentence, C positive tokens, N negative phrases
of at most P tokens, V vocabulary, L the width of the output ids.
"""

from typing import NamedTuple

import tensorflow as tf

from common.errors import UserError
from tf_transformer.layers.attention_bias import large_negative

NEG_INF = large_negative(tf.float32)
NOT_IN_PHRASE = -1


class ConstraintError(UserError):
  """A sentence's constraints that cannot be met: `sentence` (its index from 0) and `problem`."""

  def __init__(self, sentence: int, problem: str):
    super().__init__(f"the constraints of sentence {sentence + 1}: {problem}")
    self.sentence = sentence
    self.problem = problem


class Constraints(NamedTuple):
  """A batch's constraints (0: padding, which no real token is).

  tokens: int32 [B, C], each sentence's positive phrases one after another.
  continues: bool [B, C], a token followed by the next one of its phrase.
  banned: int32 [B, N, P], each sentence's negative phrases.
  word_inside: optional bool [V]: the tokens that go on with the word before them (a subword
    piece that starts with a letter or digit and no word boundary): none may follow a positive
    phrase, so that a phrase is met as whole words ("Hund" not by "Hunde").
  """
  tokens: tf.Tensor
  continues: tf.Tensor
  banned: tf.Tensor
  word_inside: tf.Tensor | None = None


# The per-sentence fields of Constraints and their ranks ([B, C] and [B, N, P]): what a
# request's shapes pad and bucket.
PER_SENTENCE_RANKS = {"tokens": 2, "continues": 2, "banned": 3}


def from_phrases(positive, negative, word_inside=None):
  """Constraints from phrases of token ids.

  Args:
    positive: int32 ragged [B, (phrases), (tokens)], each sentence's positive phrases.
    negative: int32 ragged [B, (phrases), (tokens)], each sentence's negative phrases.
    word_inside: optional bool [V] (see Constraints).
  """
  tokens = positive.merge_dims(1, 2)  # -> [B, (C)]
  phrase_lengths = positive.values.row_lengths()  # -> [all phrases]
  within = tf.ragged.range(phrase_lengths).flat_values  # each token's place in its phrase
  continues = positive.with_flat_values(
      within + 1 < tf.repeat(phrase_lengths, phrase_lengths)).merge_dims(1, 2)
  return Constraints(tokens.to_tensor(0), continues.to_tensor(False), negative.to_tensor(0),
                     word_inside)


class State(NamedTuple):
  """What each hypothesis has met.

  met: bool [B, K, C], the positive tokens met (a phrase's, only once met in full or while
    it is being met).
  next_token: int32 [B, K], the index into C of the next token of the phrase being met, or
    NOT_IN_PHRASE.
  completed: bool [B, K], whether the last token completed a phrase.
  """
  met: tf.Tensor
  next_token: tf.Tensor
  completed: tf.Tensor


def initial_state(constraints: Constraints, beam_size: int) -> State:
  batch, count = tf.shape(constraints.tokens)[0], tf.shape(constraints.tokens)[1]
  return State(tf.zeros([batch, beam_size, count], tf.bool),
               tf.fill([batch, beam_size], NOT_IN_PHRASE), tf.zeros([batch, beam_size], tf.bool))


def after_phrase_logits(logits, constraints: Constraints, state: State):
  """`logits` (float32 [B * K, V]) with a large negative at the word_inside tokens in the rows
  of the hypotheses that have just completed a phrase."""
  if constraints.word_inside is None:
    return logits
  completed = tf.reshape(state.completed, [-1, 1])
  return tf.where(completed & constraints.word_inside[tf.newaxis], NEG_INF, logits)


def unmet(constraints: Constraints, state: State):
  """int32 [B, K]: the positive tokens each hypothesis has still to meet."""
  real = tf.not_equal(constraints.tokens, 0)[:, tf.newaxis]
  return tf.reduce_sum(tf.cast(real & tf.logical_not(state.met), tf.int32), axis=-1)


def met_count(state: State):
  """int32 [B, K]: the positive tokens each hypothesis has met (its bank)."""
  return tf.reduce_sum(tf.cast(state.met, tf.int32), axis=-1)


def _phrase_starts(continues):
  """bool [B, C]: the first token of each phrase."""
  previous_continues = tf.pad(continues[:, :-1], [[0, 0], [1, 0]])
  return tf.logical_not(previous_continues)


def allowed_tokens(constraints: Constraints, state: State):
  """bool [B, K, C]: the positive tokens each hypothesis may meet next: the next token of the
  phrase it is in, or else the first token of each phrase it has not met."""
  count = tf.shape(constraints.tokens)[1]
  real = tf.not_equal(constraints.tokens, 0)[:, tf.newaxis]  # -> [B, 1, C]
  starts = _phrase_starts(constraints.continues)[:, tf.newaxis]
  in_phrase = tf.not_equal(state.next_token, NOT_IN_PHRASE)[:, :, tf.newaxis]
  is_next = tf.equal(tf.range(count), state.next_token[:, :, tf.newaxis])
  return real & tf.where(in_phrase, is_next, starts & tf.logical_not(state.met))


def advance(constraints: Constraints, state: State, tokens) -> State:
  """The state of each hypothesis after it writes `tokens`.

  Args:
    constraints: the batch's, tokens [B, C].
    state: of the hypotheses before the token, met [B, M, C] and next_token [B, M].
    tokens: int32 [B, M], each hypothesis's new token.

  Returns:
    State [B, M, C] and [B, M].
  """
  count = tf.shape(constraints.tokens)[1]
  positions = tf.range(count)
  real = tf.not_equal(constraints.tokens, 0)[:, tf.newaxis]  # -> [B, 1, C]
  matches = real & tf.equal(constraints.tokens[:, tf.newaxis], tokens[:, :, tf.newaxis])
  in_phrase = tf.not_equal(state.next_token, NOT_IN_PHRASE)  # -> [B, M]
  expected = tf.equal(positions, state.next_token[:, :, tf.newaxis])  # -> [B, M, C]
  goes_on = in_phrase & tf.reduce_any(expected & matches, axis=-1)
  # a phrase abandoned gives back the tokens met of it: those after the last phrase start at
  # or before the next token (its own start) and before the next token
  starts = _phrase_starts(constraints.continues)[:, tf.newaxis]  # -> [B, 1, C]
  start_index = tf.reduce_max(
      tf.where(starts & (positions <= state.next_token[:, :, tf.newaxis]), positions, -1),
      axis=-1)  # -> [B, M]
  of_phrase = ((positions >= start_index[:, :, tf.newaxis])
               & (positions < state.next_token[:, :, tf.newaxis]))
  abandons = in_phrase & tf.logical_not(goes_on)
  met = tf.where(abandons[:, :, tf.newaxis] & of_phrase, False, state.met)
  # out of a phrase (or just out of one): the token may start the first unmet phrase it begins
  can_start = tf.logical_not(in_phrase) | abandons
  startable = starts & tf.logical_not(met) & matches
  first = tf.reduce_min(tf.where(startable, positions, count), axis=-1)  # count: none
  starts_one = can_start & (first < count)
  met_now = tf.where(goes_on, state.next_token, tf.where(starts_one, first, -1))  # -> [B, M]
  met_here = tf.equal(positions, met_now[:, :, tf.newaxis])  # -> [B, M, C]
  met |= met_here
  continues = tf.reduce_any(met_here & constraints.continues[:, tf.newaxis], axis=-1)
  next_token = tf.where(continues, met_now + 1, NOT_IN_PHRASE)
  return State(met, next_token, (met_now >= 0) & tf.logical_not(continues))


def banned_logits(logits, constraints: Constraints, alive_ids, step, beam_size: int):
  """`logits` with a large negative at each token that would complete a negative phrase.

  Args:
    logits: float32 [B * K, V].
    constraints: banned [B, N, P].
    alive_ids: int32 [B, K, L], the hypotheses, their tokens before `step`.
    step: int32 scalar, the position of the next token.
  """
  banned = constraints.banned
  if banned.shape[1] == 0 or banned.shape[2] == 0:
    return logits
  width = tf.shape(banned)[2]
  lengths = tf.reduce_sum(tf.cast(tf.not_equal(banned, 0), tf.int32), axis=-1)  # -> [B, N]
  # the phrase's first n - 1 tokens must be the hypothesis's last n - 1
  offsets = tf.range(width)  # -> [P]
  wanted_positions = step - (lengths[:, :, tf.newaxis] - 1) + offsets  # -> [B, N, P]
  needed = offsets < lengths[:, :, tf.newaxis] - 1
  positions = tf.clip_by_value(wanted_positions, 0, tf.shape(alive_ids)[2] - 1)
  written = tf.gather(alive_ids, tf.reshape(positions, [tf.shape(banned)[0], -1]), axis=2,
                      batch_dims=1)  # -> [B, K, N * P]
  written = tf.reshape(written, tf.concat([tf.shape(alive_ids)[:2], tf.shape(banned)[1:]], 0))
  agrees = tf.equal(written, banned[:, tf.newaxis]) & (wanted_positions >= 0)[:, tf.newaxis]
  completes = tf.reduce_all(agrees | tf.logical_not(needed)[:, tf.newaxis], axis=-1)
  completes &= (lengths > 0)[:, tf.newaxis]  # -> [B, K, N]
  last = tf.gather(banned, tf.maximum(lengths - 1, 0), axis=2, batch_dims=2)  # -> [B, N]
  last = tf.broadcast_to(last[:, tf.newaxis], tf.shape(completes))
  rows = tf.broadcast_to(tf.range(tf.shape(logits)[0])[:, tf.newaxis],
                         [tf.shape(logits)[0], tf.shape(banned)[1]])
  indices = tf.stack([rows, tf.reshape(last, tf.shape(rows))], axis=-1)
  values = tf.where(tf.reshape(completes, tf.shape(rows)), NEG_INF, tf.float32.max)
  return tf.tensor_scatter_nd_min(logits, indices, values)


def banked_top_k(scores, banks, k: int):
  """The indices of k candidates of each sentence, the best of each bank in turn.

  Candidates are ranked within their bank by score; the chosen are the rank-0 candidates of
  every bank (the bank that has met the most tokens first), then the rank-1 ones, and so on,
  so a bank with fewer candidates than its share leaves its places to the others.

  Args:
    scores: float32 [B, M], NEG_INF (or below NEG_INF / 2): not a candidate.
    banks: int32 [B, M], each candidate's bank (its constraint tokens met), 0 <= bank < M.
    k: the candidates to choose, <= M.

  Returns:
    int32 [B, k] indices into M, by descending score.
  """
  count = tf.shape(scores)[1]
  valid = scores > NEG_INF / 2
  same_bank = tf.equal(banks[:, :, tf.newaxis], banks[:, tf.newaxis, :])  # -> [B, M, M]
  index = tf.range(count)
  better = ((scores[:, tf.newaxis, :] > scores[:, :, tf.newaxis])
            | (tf.equal(scores[:, tf.newaxis, :], scores[:, :, tf.newaxis])
               & (index[tf.newaxis, :] < index[:, tf.newaxis])))
  rank = tf.reduce_sum(tf.cast(same_bank & better & valid[:, tf.newaxis, :], tf.int32),
                       axis=-1)  # -> [B, M]
  order = rank * count + (count - 1 - banks)  # lower comes first
  order = tf.where(valid, order, count * count + index)  # non-candidates last
  _, chosen = tf.math.top_k(-order, k=k)
  chosen_scores = tf.gather(scores, chosen, batch_dims=1)
  _, by_score = tf.math.top_k(chosen_scores, k=k)
  return tf.gather(chosen, by_score, batch_dims=1)
