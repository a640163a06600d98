"""Lexical constraints: the constraint state by hand, and constrained beam search against an
exhaustive search over the outputs that satisfy the constraints (the toy model of
beam_search_test)."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tests.tf_transformer.decoding.beam_search_test import (EOS, START, MAX_LENGTH, finished_sequences,
                                                   sequence_log_prob, toy_logits)
from tf_transformer.decoding import lexical_constraints as lc
from tf_transformer.decoding.beam_search import beam_search
from tf_transformer.decoding.constrained_search import constrained_beam_search
from tf_transformer.decoding.search_ops import NEG_INF, length_penalty


def ragged(phrases):
  """int32 ragged [B, (phrases), (tokens)] of nested lists [sentence][phrase][token]."""
  tokens = [token for sentence in phrases for phrase in sentence for token in phrase]
  return tf.RaggedTensor.from_nested_row_lengths(
      tf.constant(tokens, tf.int32),
      [[len(sentence) for sentence in phrases],
       [len(phrase) for sentence in phrases for phrase in sentence]])


def constraints_of(positive, negative=None):
  """Constraints of a batch from nested lists of token ids: [sentence][phrase][token]."""
  negative = negative if negative is not None else [[] for _ in positive]
  return lc.from_phrases(ragged(positive), ragged(negative))


def test_from_phrases_lays_the_phrases_end_to_end_and_marks_what_continues():
  c = constraints_of([[[7, 8, 9], [5]], [[6]]], [[[3, 4]], [[2], [5, 6, 7]]])
  np.testing.assert_array_equal(c.tokens, [[7, 8, 9, 5], [6, 0, 0, 0]])
  np.testing.assert_array_equal(c.continues, [[True, True, False, False], [False] * 4])
  np.testing.assert_array_equal(c.banned, [[[3, 4, 0], [0, 0, 0]], [[2, 0, 0], [5, 6, 7]]])


def walk(constraints, tokens):
  """The states of one hypothesis (sentence 0) after each of `tokens`: (met, next_token)."""
  state = lc.initial_state(constraints, 1)
  states = []
  for token in tokens:
    state = lc.advance(constraints, state, tf.constant([[token]]))
    states.append((state.met.numpy()[0, 0].tolist(), int(state.next_token[0, 0])))
  return states


def test_advance_meets_phrases_in_any_order_and_gives_back_a_phrase_left_half_way():
  c = constraints_of([[[7, 8, 9], [5]]])
  f, t = False, True
  assert walk(c, [5, 7, 8, 4, 7, 8, 9, 5]) == [
      ([f, f, f, t], -1),  # the one-token phrase, met
      ([t, f, f, t], 1),  # 7 begins "7 8 9": 8 is next
      ([t, t, f, t], 2),
      ([f, f, f, t], -1),  # 4 is not 9: "7 8" is given back
      ([t, f, f, t], 1),
      ([t, t, f, t], 2),
      ([t, t, t, t], -1),  # every token met
      ([t, t, t, t], -1),  # a phrase met counts once
  ]
  # a phrase left for the start of another (or of itself) begins that one at once
  assert walk(c, [7, 7, 8])[-1] == ([t, t, f, f], 2)
  assert walk(c, [7, 5])[-1] == ([f, f, f, t], -1)


def test_allowed_tokens_are_the_next_of_the_phrase_begun_or_the_unmet_phrase_starts():
  c = constraints_of([[[7, 8, 9], [5], [6]]])
  state = lc.initial_state(c, 1)
  np.testing.assert_array_equal(lc.allowed_tokens(c, state)[0, 0], [1, 0, 0, 1, 1])
  state = lc.advance(c, state, tf.constant([[5]]))
  np.testing.assert_array_equal(lc.allowed_tokens(c, state)[0, 0], [1, 0, 0, 0, 1])
  state = lc.advance(c, state, tf.constant([[7]]))
  np.testing.assert_array_equal(lc.allowed_tokens(c, state)[0, 0], [0, 1, 0, 0, 0])
  assert int(lc.unmet(c, state)[0, 0]) == 3 and int(lc.met_count(state)[0, 0]) == 2


def test_banned_logits_mask_the_token_that_would_complete_a_negative_phrase():
  c = constraints_of([[]], [[[3, 4], [6]]])
  alive_ids = tf.constant([[[2, 3, 0, 0], [3, 2, 0, 0]]])  # two hypotheses, step 2
  logits = tf.zeros([2, 8])
  masked = lc.banned_logits(logits, c, alive_ids, tf.constant(2), 2).numpy()
  expected = np.zeros([2, 8], np.float32)
  expected[:, 6] = NEG_INF  # a one-token phrase: everywhere
  expected[0, 4] = NEG_INF  # "3 4": only after a 3
  np.testing.assert_array_equal(masked, expected)
  # at step 0 nothing comes before: only the one-token phrase
  masked = lc.banned_logits(logits, c, alive_ids, tf.constant(0), 2).numpy()
  assert (masked[:, 4] == 0).all() and (masked[:, 6] == NEG_INF).all()


def test_banked_top_k_takes_the_best_of_each_bank_in_turn():
  scores = tf.constant([[-1.0, -2.0, -3.0, -4.0, -5.0, NEG_INF]])
  banks = tf.constant([[0, 0, 0, 1, 2, 2]])
  # rank 0 of banks 2, 1, 0 (-5, -4, -1), then rank 1 of bank 0 (-2); by score
  np.testing.assert_array_equal(lc.banked_top_k(scores, banks, 4), [[0, 1, 3, 4]])
  # one bank alone: the plain top k
  np.testing.assert_array_equal(lc.banked_top_k(scores, tf.zeros_like(banks), 3), [[0, 1, 2]])


def constrained_search(beam_size, positive, negative=None, alpha=0.6, max_length=MAX_LENGTH):
  batch = len(positive)
  ids, scores = constrained_beam_search(
      toy_logits, tf.fill([batch], START), {"sum": tf.zeros([batch], tf.int32)}, beam_size,
      alpha, max_length, EOS, constraints_of(positive, negative))
  return ids.numpy(), scores.numpy()


def contains(sequence, phrase):
  n = len(phrase)
  return any(tuple(sequence[i:i + n]) == tuple(phrase) for i in range(len(sequence) - n + 1))


def exhaustive_best(positive, negative, alpha):
  """The best finished output of the toy model that contains every positive phrase and no
  negative one, with its score, by enumeration in float64."""
  best, best_score = None, -np.inf
  for sequence in finished_sequences(MAX_LENGTH):
    if (all(contains(sequence, p) for p in positive)
        and not any(contains(sequence, p) for p in negative)):
      score = sequence_log_prob(sequence) / float(length_penalty(len(sequence), alpha))
      if score > best_score:
        best, best_score = sequence, score
  return best, best_score


@pytest.mark.parametrize("positive, negative", [
    ([[4]], []),
    ([[4, 4]], []),
    ([[3, 4, 2]], []),
    ([[4], [3]], [[2]]),
    ([[3, 2]], [[4]]),
    ([], [[3]]),
])
def test_constrained_search_finds_the_exhaustive_best_of_the_outputs_that_satisfy(
    positive, negative):
  unconstrained, _ = exhaustive_best([], [], 0.6)
  best, best_score = exhaustive_best(positive, negative, 0.6)
  assert best != unconstrained  # the constraints change the answer
  ids, scores = constrained_search(8, [positive], [negative])
  found = tuple(ids[0, 0, :len(best)])
  assert found == best
  np.testing.assert_allclose(scores[0, 0], best_score, rtol=1e-5)
  # its score is the forced decoding's: the log-probability of the model, not renormalised
  np.testing.assert_allclose(scores[0, 0] * float(length_penalty(len(best), 0.6)),
                             sequence_log_prob(best), rtol=1e-5)


def test_every_hypothesis_of_a_narrow_beam_satisfies_its_sentence_constraints():
  positive = [[[3]], [[4, 2]], [[2], [3]], [[3, 3]], [[4], [2, 2]]]
  negative = [[[2]], [[3]], [], [[4]], [[3, 4]]]
  ids, scores = constrained_search(2, positive, negative)
  for row, (pos, neg) in enumerate(zip(positive, negative)):
    for hypothesis, score in zip(ids[row], scores[row]):
      assert score > NEG_INF / 2
      tokens = list(hypothesis)
      tokens = tokens[:tokens.index(EOS)] if EOS in tokens else tokens
      assert all(contains(tokens, p) for p in pos), (row, tokens)
      assert not any(contains(tokens, p) for p in neg), (row, tokens)


def test_constraints_that_fill_the_limit_are_met_by_the_last_place():
  # three tokens of a limit of four: every output begins "4 4 3" or "3 4 4" (then EOS, or
  # another token in a live hypothesis cut at the limit)
  ids, _ = constrained_search(2, [[[4, 4], [3]]], max_length=4)
  for hypothesis in ids[0]:
    assert hypothesis[:3].tolist() in ([4, 4, 3], [3, 4, 4])


def test_sentences_without_constraints_decode_as_plain_beam_search_bit_for_bit():
  batch = 3
  plain_ids, plain_scores = beam_search(toy_logits, tf.fill([batch], START),
                                        {"sum": tf.zeros([batch], tf.int32)}, 3, 0.6,
                                        MAX_LENGTH, EOS)
  ids, scores = constrained_search(3, [[], [], [[3]]], [[], [], []])
  np.testing.assert_array_equal(ids[:2], plain_ids.numpy()[:2])
  np.testing.assert_array_equal(scores[:2], plain_scores.numpy()[:2])
  assert not np.array_equal(ids[2], plain_ids.numpy()[2])


def test_a_hypothesis_that_met_its_term_early_survives_a_narrow_beam():
  """A bigram toy where the best output with the term t starts with it ("t b c"), but every
  one of the 2K best extensions at step 1 extends the likelier "a": only each hypothesis's own
  best extension among the candidates (Post & Vilar's third kind) keeps "t" alive; without it
  the term lands at the end ("a b c t b"), far worse."""
  eos, start, a, b, c, t, d = 1, 2, 3, 4, 5, 6, 7
  logits = np.full((8, 8), -1e9, np.float32)
  for prev, row in {start: {a: 5, t: 2, b: 0, c: 0},
                    a: {b: 5, c: 4.9, d: 4.85, a: 4.8, eos: 4.7, t: 0},
                    t: {b: 5, eos: 0, a: 0, c: 0}, b: {c: 5, eos: 0, a: 0, t: 0, b: 0},
                    c: {eos: 5, t: 1, a: 0, b: 0, c: 0}, d: {c: 5, eos: 0}}.items():
    for token, value in row.items():
      logits[prev, token] = value
  log_probs = testutil.log_softmax(logits.astype(np.float64))

  def score(sequence):
    total = sum(log_probs[prev, token] for prev, token in zip((start,) + sequence, sequence))
    return total / float(length_penalty(len(sequence), 0.6))

  outputs = [body + (eos,) for n in range(6) for body in itertools.product((a, b, c, t, d),
                                                                           repeat=n)]
  best = max((o for o in outputs if t in o), key=score)
  assert best == (t, b, c, eos)
  ids, scores = constrained_beam_search(
      lambda ids, step, cache: (tf.gather(logits, ids), cache), tf.fill([1], start),
      {"unused": tf.zeros([1])}, 2, 0.6, 6, eos, constraints_of([[[t]]]))
  assert tuple(ids[0, 0, :4].numpy()) == best
  np.testing.assert_allclose(scores[0, 0], score(best), rtol=1e-5)


def test_after_a_phrase_the_word_inside_tokens_are_masked_in_that_row_alone():
  """The whole-word rule by hand: phrase "3 4", token 5 goes on with the word before it. Only
  the hypothesis that has just written the phrase's last token loses 5; one in the middle of
  the phrase, one past it and any search without the rule keep every logit."""
  word_inside = tf.constant([False] * 5 + [True])
  constraints = lc.from_phrases(ragged([[[3, 4]]]), ragged([[]]), word_inside)
  logits = tf.reshape(tf.range(18, dtype=tf.float32), [3, 6])  # 3 hypotheses, V = 6

  def after(*steps):
    state = lc.initial_state(constraints, 3)
    for tokens in steps:
      state = lc.advance(constraints, state, tf.constant([tokens]))
    return state

  # the three hypotheses wrote "3 4" (just completed), "3" (in the phrase), "2 4"
  just_done = after([3, 3, 2], [4, 3, 4])
  assert just_done.completed.numpy().tolist() == [[True, False, False]]
  want = logits.numpy().copy()
  want[0, 5] = NEG_INF
  np.testing.assert_array_equal(lc.after_phrase_logits(logits, constraints, just_done), want)
  past = after([3, 3, 2], [4, 3, 4], [2, 2, 2])  # "3 4 2": the phrase met, a word after it
  np.testing.assert_array_equal(lc.after_phrase_logits(logits, constraints, past), logits)
  without_rule = lc.from_phrases(ragged([[[3, 4]]]), ragged([[]]))
  np.testing.assert_array_equal(lc.after_phrase_logits(logits, without_rule, just_done), logits)


def test_a_term_is_met_as_a_whole_word():
  """A bigram toy of "Hund" (h) and the piece "e" that would make it "Hunde": after h, e is
  the likeliest (5 against EOS's 3). With e marked as going on with its word, the constrained
  search writes "h EOS"; without the rule, "h e EOS"."""
  eos, start, h, a, e = 1, 2, 3, 4, 5
  logits = np.full((6, 6), -1e9, np.float32)
  for prev, row in {start: {h: 5, a: 1}, h: {e: 5, eos: 3, a: 1}, e: {eos: 5},
                    a: {eos: 5}}.items():
    for token, value in row.items():
      logits[prev, token] = value

  def bigram(ids, step, cache):
    return tf.gather(tf.constant(logits), ids), cache

  def search(word_inside):
    constraints = lc.from_phrases(ragged([[[h]]]), ragged([[]]), word_inside)
    ids, _ = constrained_beam_search(bigram, tf.constant([start]), {}, 2, 0.0, 5, eos,
                                     constraints)
    return ids.numpy()[0, 0].tolist()

  assert search(tf.constant([False] * 5 + [True])) == [h, eos, 0, 0, 0]
  assert search(None) == [h, e, eos, 0, 0]
