"""Translating lists of sentences and scoring them: dev loss, sacreBLEU."""

import numpy as np
import sacrebleu
import tensorflow as tf

from data_pipeline.tokenizer import EOS_ID
from tf_transformer import decoding, losses
from tf_transformer.layers.attention_bias import PAD_ID


class Translator:
  """Translation of Python strings with a model and its vocabulary (greedy with beam 1)."""

  def __init__(self, model, vocabulary, max_length: int, extra_decode_length: int,
               batch_size: int = 64, beam_size: int = 1, alpha: float = 0.6):
    self.model = model
    self.vocabulary = vocabulary
    self.max_length = max_length
    self.batch_size = batch_size

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def decode(source_ids):
      ids, _ = decoding.decode(model, source_ids, beam_size, alpha, extra_decode_length)
      return ids[:, 0]  # -> [batch, max_decode_length], the best hypothesis

    self._decode = decode

  def _encode_sources(self, texts):
    """list of str -> ragged int32 [n, None], truncated to max_length, EOS appended."""
    ids = self.vocabulary.source.tokenize(tf.constant(texts, tf.string))[:, :self.max_length]
    eos = tf.fill([ids.nrows(), 1], EOS_ID)
    return tf.concat([ids, tf.RaggedTensor.from_tensor(eos)], axis=1)

  def translate(self, texts: list[str]) -> list[str]:
    """Translations of `texts`, in order; an empty input gives an empty output."""
    outputs = [""] * len(texts)
    todo = [i for i, text in enumerate(texts) if text.strip()]
    if not todo:
      return outputs
    source_ids = self._encode_sources([texts[i] for i in todo])
    lengths = source_ids.row_lengths().numpy()
    order = np.argsort(lengths, kind="stable")  # similar lengths share a batch: less padding
    for start in range(0, len(order), self.batch_size):
      rows = order[start:start + self.batch_size]
      batch = tf.gather(source_ids, rows).to_tensor(default_value=PAD_ID)
      tokens = decoding.strip_after_eos(self._decode(batch))
      for row, text in zip(rows, self.vocabulary.target.detokenize(tokens).numpy()):
        outputs[todo[row]] = text.decode("utf-8")
    return outputs


def corpus_bleu(hypotheses: list[str], references: list[str]):
  """sacreBLEU of detokenized text (13a tokenization, exp smoothing, one reference).

  Returns:
    (BLEUScore, its sacreBLEU signature string).
  """
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(hypotheses, [references])
  return score, str(metric.get_signature())


def make_loss_statistics(model, label_smoothing: float):
  """A compiled fn (source_ids, target_input_ids, target_ids) -> summed token statistics."""
  spec = tf.TensorSpec([None, None], tf.int32)

  @tf.function(input_signature=[spec, spec, spec])
  def statistics(source_ids, target_input_ids, target_ids):
    memory, bias = model.encode(source_ids, training=False)
    hidden = model.decode(target_input_ids, memory, bias, training=False)
    real = tf.where(tf.not_equal(target_ids, PAD_ID))
    return losses.token_statistics(model.logits(tf.gather_nd(hidden, real)),
                                   tf.gather_nd(target_ids, real), label_smoothing)

  return statistics


def dev_loss(statistics, batches) -> dict:
  """Token-averaged loss, perplexity and accuracy over one pass of `batches`.

  Args:
    statistics: from `make_loss_statistics`.
    batches: (source_ids, target_input_ids, target_ids) batches.
  """
  totals = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
  for batch in batches:
    for key, value in statistics(*batch).items():
      totals[key] += float(value)
  tokens = max(totals["tokens"], 1.0)
  return {"loss": totals["loss"] / tokens, "perplexity": float(np.exp(totals["nll"] / tokens)),
          "accuracy": totals["correct"] / tokens}
