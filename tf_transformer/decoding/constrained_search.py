"""Constrained beam search (terminology): every output contains each positive phrase of its
sentence and no negative one, by dynamic beam allocation (lexical_constraints.py).

A beam search (beam_search.py) whose `ConstrainedExpansion` adds candidates that meet
constraint tokens, keeps the live hypotheses in banks by the tokens they met, and adds its own
logit filters: EOS masked until a hypothesis has met every positive token, a token that
completes a negative phrase always, and after a phrase met, a piece that would go on with its
last word.

Sizes: B batch, K beam size, V vocabulary, C positive tokens, M = 3K + K * C candidates of a
sentence a step, L the width of the output ids.
"""

import dataclasses

import tensorflow as tf

from tf_transformer.decoding import beam_search, lexical_constraints, logit_filters
from tf_transformer.decoding.search_ops import NEG_INF, gather_beams, unflatten_beam


@dataclasses.dataclass(frozen=True)
class AvoidPhrases:
  """A large negative at each token that would complete a negative phrase of its sentence
  (lexical_constraints.banned_logits); `rows_per_sentence` K."""
  constraints: lexical_constraints.Constraints
  rows_per_sentence: int
  reads_ids = True

  def __call__(self, logits, context: logit_filters.StepContext):
    k = self.rows_per_sentence
    alive_ids = tf.reshape(context.ids, [-1, k, tf.shape(context.ids)[1]])  # -> [B, K, L]
    return lexical_constraints.banned_logits(logits, self.constraints, alive_ids,
                                             context.step, k)


@dataclasses.dataclass(frozen=True)
class WholeWords:
  """After a positive phrase met, no piece that goes on with its last word ("Hund" is not met
  by "Hunde"; lexical_constraints.after_phrase_logits)."""
  constraints: lexical_constraints.Constraints
  reads_ids = False

  def __call__(self, logits, context: logit_filters.StepContext):
    return lexical_constraints.after_phrase_logits(logits, self.constraints, context.lexical)


@dataclasses.dataclass(frozen=True)
class ConstrainedExpansion:
  """The candidates of constrained beam search (a beam_search.BeamExpansion's counterpart):
  the 2K best extensions of a sentence, each live hypothesis's best extension, and each live
  hypothesis extended by each constraint token it may meet next
  (lexical_constraints.allowed_tokens), M = 3K + K * C in all (Post & Vilar's three kinds); a
  candidate is dropped (NEG_INF) when it repeats another or leaves more tokens to meet than its
  sentence has places left before EOS. Its state: lexical_constraints.State."""
  constraints: lexical_constraints.Constraints

  def constraint_masks(self, beam_size: int) -> tuple:
    return (AvoidPhrases(self.constraints, beam_size), WholeWords(self.constraints))

  def initial_state(self, beam_size: int):
    return lexical_constraints.initial_state(self.constraints, beam_size)

  def grow(self, symbols_to_logits_fn, step, last_ids, alive_ids, alive_log_probs, cache,
           state, setup: beam_search.Setup):
    """As BeamExpansion.grow; `state` and the candidates' state are lexical_constraints.State
    ([B, K, C], [B, K], [B, K]; [B, M, C], [B, M] x 2)."""
    constraints, k, batch = self.constraints, setup.beam_size, setup.batch
    unmet = lexical_constraints.unmet(constraints, state)  # -> [B, K]
    no_eos = tf.reshape((unmet > 0) | (step + 1 < setup.min_decode_length), [-1, 1])
    allowed, normaliser, cache = beam_search.next_logits(
        symbols_to_logits_fn, step, last_ids, alive_ids, cache, no_eos, setup, state)
    best = beam_search.best_extensions(allowed, normaliser, alive_log_probs, batch, k)
    # each live hypothesis's own best next token: the 2K best of a sentence may all extend the
    # likeliest hypotheses, and a hypothesis of a bank that met more tokens would die out
    own_log_probs = best.row_log_probs[:, :, 0]  # -> [B, K]
    own_tokens = best.row_tokens[:, :, 0]
    # each live hypothesis followed by each constraint token: [B, K, C] -> [B, K * C]
    count = tf.shape(constraints.tokens)[1]
    tokens = tf.broadcast_to(constraints.tokens[:, tf.newaxis], [batch, k, count])
    normalised = unflatten_beam(allowed - normaliser, batch, k)  # -> [B, K, V]
    met_log_probs = (tf.gather(normalised, tokens, batch_dims=2)
                     + alive_log_probs[:, :, tf.newaxis])
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
    parent_state = lexical_constraints.State(*(gather_beams(t, top_beams) for t in state))
    new_state = lexical_constraints.advance(constraints, parent_state, top_tokens)
    # places left for tokens before EOS, after this one (a hypothesis cut at its limit must
    # have met every token by then too)
    places_left = tf.maximum(setup.limits - 2 - step, 0)[:, tf.newaxis]
    fits = lexical_constraints.unmet(constraints, new_state) <= places_left
    top_log_probs = tf.where(valid & tf.logical_not(repeats) & fits, top_log_probs, NEG_INF)
    top_ids = beam_search.extended_ids(alive_ids, top_beams, top_tokens, step,
                                       setup.buffer_length)
    return top_ids, top_log_probs, top_tokens, top_beams, new_state, cache

  def keep(self, alive_candidates, state, beam_size: int):
    """int32 [B, K]: the candidates that live on, in banks by the tokens each met
    (lexical_constraints.banked_top_k)."""
    return lexical_constraints.banked_top_k(alive_candidates,
                                            lexical_constraints.met_count(state), beam_size)


def constrained_beam_search(symbols_to_logits_fn, initial_ids, initial_cache, beam_size: int,
                            alpha: float, max_decode_length, eos_id: int, constraints,
                            **options):
  """beam_search.beam_search under `constraints` (lexical_constraints.Constraints): the
  positive tokens must fit before each sentence's limit (the caller checks); a sentence whose
  hypotheses cannot meet them gets scores below NEG_INF / 2. `options`: beam_search's
  min_decode_length, buffer_length, prefix_ids, gives_log_probs, repetition."""
  return beam_search.beam_search(symbols_to_logits_fn, initial_ids, initial_cache, beam_size,
                                 alpha, max_decode_length, eos_id,
                                 expansion=ConstrainedExpansion(constraints), **options)
