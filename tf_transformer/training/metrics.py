"""Scoring translations (sacreBLEU, chrF) and the dev loss."""

from absl import logging
import numpy as np
import sacrebleu
import tensorflow as tf

from tf_transformer.training import losses


_warned_tokenized = False  # once a process: a run evaluates every few hundred steps


def _looks_tokenized(sentences: list[str]) -> bool:
  """Whether most sentences end in a detached period, as tokenized text does ("a dog .")."""
  return sum(s.endswith(" .") for s in sentences) > len(sentences) / 2


def corpus_bleu(hypotheses: list[str], references: list[str]):
  """sacreBLEU of detokenized text (13a tokenization, exp smoothing, one reference).

  References that are tokenized as shipped (IWSLT'15, the Vietnamese of JaViCorpus) are scored
  as they are, with one warning a run instead of sacreBLEU's three lines at every evaluation.

  Returns:
    (BLEUScore, its sacreBLEU signature string).
  """
  global _warned_tokenized
  if not _warned_tokenized and _looks_tokenized(references):
    _warned_tokenized = True
    logging.warning("the references are tokenized text (most lines end in ' .'): BLEU is of "
                    "that text as it is, comparable only with scores of the same files")
  metric = sacrebleu.metrics.BLEU(force=True)  # force: only silences that warning.
  score = metric.corpus_score(hypotheses, [references])
  return score, str(metric.get_signature())


def corpus_chrf(hypotheses: list[str], references: list[str]):
  """sacreBLEU's chrF2 (character 6-grams, beta 2, one reference).

  Returns:
    (CHRFScore, its sacreBLEU signature string).
  """
  metric = sacrebleu.metrics.CHRF()
  return metric.corpus_score(hypotheses, [references]), str(metric.get_signature())


def report(hypotheses: list[str], references: list[str]) -> dict:
  """sacreBLEU with its signature, chrF, and BLEU with max n-gram order 1..4."""
  bleu, signature = corpus_bleu(hypotheses, references)
  chrf, chrf_signature = corpus_chrf(hypotheses, references)
  results = {"bleu": bleu.score, "bleu_text": str(bleu), "bleu_signature": signature,
             "chrf": chrf.score, "chrf_signature": chrf_signature}
  for order in range(1, 5):
    metric = sacrebleu.metrics.BLEU(max_ngram_order=order, force=True)
    results[f"bleu_{order}"] = metric.corpus_score(hypotheses, [references]).score
  return results


def make_loss_statistics(model, label_smoothing: float):
  """A compiled fn (source_ids, target_input_ids, target_ids) -> summed token statistics."""
  spec = tf.TensorSpec([None, None], tf.int32)

  @tf.function(input_signature=[spec, spec, spec], autograph=False)
  def statistics(source_ids, target_input_ids, target_ids):
    return losses.batch_statistics(model, (source_ids, target_input_ids, target_ids),
                                   label_smoothing, training=False)

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
