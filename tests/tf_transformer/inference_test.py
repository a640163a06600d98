"""Sentence lists through the inference functions: token-based batches, hard alignments."""

import numpy as np
import tensorflow as tf

from tf_transformer import inference
from tf_transformer.config import DecodeConfig
from tf_transformer.inference import hard_alignment, load_inference, make_batches, translate_texts

TEXTS = ["aa", "bb cc dd", "ee ff gg hh ii", "", "jj kk ll mm nn oo pp qq", "aa bb",
         "cc dd ee ff gg hh ii jj kk ll mm nn", " ", "oo pp qq rr", "ss"]


def test_batches_keep_within_rows_and_tokens():
  lengths = [3, 9, 1, 4, 4, 12, 2, 7, 30, 5]
  for batch_size, batch_tokens in [(3, None), (None, 16), (2, 16), (None, 1)]:
    batches = make_batches(lengths, batch_size, batch_tokens)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
      assert batch_size is None or len(batch) <= batch_size
      # a row longer than the limit (30 > 16) goes alone
      assert batch_tokens is None or len(batch) == 1 or \
          len(batch) * max(lengths[i] for i in batch) <= batch_tokens
  # shortest first, each batch filled as far as the limit allows
  assert make_batches(lengths, None, 16) == [[2, 6, 0, 3], [4, 9], [7], [1], [5], [8]]


def test_token_batches_translate_like_sentence_batches(tiny_model_dir):
  functions = load_inference(None, str(tiny_model_dir), "en", "de",
                             DecodeConfig(beam_size=2, nbest=2, max_length=8,
                                          extra_decode_length=4))
  texts = TEXTS
  counts = functions.count_tokens(texts, "source")
  vocabulary = inference.load_for_inference(str(tiny_model_dir), "en", "de")[1]
  pieces = vocabulary.source.tokenize(tf.constant(texts)).row_lengths().numpy()
  assert counts == [min(int(n), 8) + 1 for n in pieces]  # + </s>, truncated at max_length
  batches = []

  def recording(batch):
    batches.append([text.decode() for text in batch.numpy()])
    return functions.translate_nbest(batch)

  by_tokens = translate_texts(recording, texts, batch_size=None, batch_tokens=12,
                              count_tokens=functions.count_tokens)
  by_sentences = translate_texts(functions.translate_nbest, texts, batch_size=3)
  assert len(batches) > 1 and max(len(batch) for batch in batches) > 1
  for batch in batches:
    longest = max(functions.count_tokens(batch, "source"))
    assert len(batch) == 1 or len(batch) * longest <= 12, batch
  assert by_tokens[0] == by_sentences[0]
  for got, expected in zip(by_tokens[1], by_sentences[1]):
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_hard_alignment_takes_each_target_pieces_most_attended_source_piece():
  source = ["\u2581a", "\u2581b", "c", "</s>", ""]
  target = ["\u2581x", "y", "\u2581z", "</s>", ""]
  attention = np.array([[0.1, 0.6, 0.1, 0.2, 0.0],
                        [0.1, 0.1, 0.2, 0.6, 0.0],   # </s> is left out: c (2) wins
                        [0.5, 0.2, 0.2, 0.1, 0.0],
                        [0.0, 0.0, 0.1, 0.9, 0.0],   # the target </s>: no pair
                        [0.0, 0.0, 0.0, 0.0, 0.0]])  # padding
  assert hard_alignment(attention, source, target) == [(1, 0), (2, 1), (0, 2)]
  assert hard_alignment(attention[:, 3:], ["</s>", ""], target) == []  # a blank source
