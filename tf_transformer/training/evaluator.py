"""Dev evaluation during training: loss and BLEU, the best checkpoint by dev BLEU, early
stopping, and the test score of the run's final weights."""

import dataclasses
import os
import time
from typing import NamedTuple

import tensorflow as tf
from absl import logging

from common import files
from common.progress import ProgressBar
from tf_transformer.training import attention_plot, metrics
from tf_transformer import checkpoints
from tf_transformer.length_batching import translate_texts
from tf_transformer.training.train_step import all_finite
from tf_transformer.serving.translator import Translator

_SAMPLES = 4  # dev translations shown in TensorBoard at each evaluation
_ATTENTION_SENTENCES = 2  # the first dev sentences whose attention TensorBoard shows


class _Scored(NamedTuple):
  """One target language's translations of a dev or test set and their scores."""
  sources: tuple
  references: tuple
  hypotheses: list
  bleu: object  # sacrebleu BLEUScore
  bleu_signature: str
  chrf: object  # sacrebleu CHRFScore
  chrf_signature: str


def _suffix(lang: str, scored: dict) -> str:
  """"_fr" for a figure of one of several target languages, "" for a bilingual task's."""
  return f"_{lang}" if len(scored) > 1 else ""


def _figures(scored: dict[str, _Scored], prefix: str = "") -> dict[str, float]:
  """{prefix}bleu and {prefix}chrf: a bilingual task's, or each target language's (suffixed
  "_{lang}") and their mean, the figure that selects checkpoints and final weights."""
  figures = {}
  for lang, s in scored.items():
    figures[f"{prefix}bleu{_suffix(lang, scored)}"] = s.bleu.score
    figures[f"{prefix}chrf{_suffix(lang, scored)}"] = s.chrf.score
  if len(scored) > 1:
    for metric in (f"{prefix}bleu", f"{prefix}chrf"):
      figures[metric] = sum(figures[f"{metric}_{lang}"] for lang in scored) / len(scored)
  return figures


class Evaluator:
  """Evaluates a model on its task's dev set and keeps the best checkpoint.

  Create it inside the strategy's scope: its two counters (`state`) are saved with the
  training checkpoint, so a resumed run keeps its best BLEU and its patience.

  Args:
    model: the Transformer being trained.
    data: the task's data (dev_batches, dev_pairs, test_pairs, vocabulary). A multilingual
      task's dev and test pairs are a set per target language: the figures are each set's,
      and their mean (the dev BLEU that selects checkpoints and final weights).
    train_config: label_smoothing, eval_sentences, eval_batch_size, eval_beam_size and
      early_stopping.
    decode_config: the search; its beam size is replaced by eval_beam_size.
    best_dir: the folder of the best checkpoint.
    writer: tf.summary writer of the dev figures.
  """

  def __init__(self, model, data, train_config, decode_config, best_dir: str, writer):
    self.data = data
    self._model = model
    self.config = train_config
    self.writer = writer
    self.best_bleu = tf.Variable(-1.0, trainable=False, name="best_bleu")
    self.evals_without_improvement = tf.Variable(0, trainable=False,
                                                 name="evals_without_improvement")
    self.best_manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), best_dir,
                                                   1, checkpoint_name="ckpt")
    search = dataclasses.replace(decode_config, strategy="beam",
                                 beam_size=train_config.eval_beam_size, nbest=1)
    self.translator = Translator(model, data.vocabulary, search)
    self._loss_statistics = metrics.make_loss_statistics(model, train_config.label_smoothing)
    # built once, a pass per evaluation: building it traces its map functions each time
    self._dev_batches = data.dev_batches()

  @property
  def state(self) -> dict:
    """The variables a resumed run must get back, by their checkpoint names."""
    return {"best_bleu": self.best_bleu,
            "evals_without_improvement": self.evals_without_improvement}

  def translate(self, texts: list[str], what: str = "dev") -> list[str]:
    """The model's translations of `texts` with the evaluation search (eval_beam_size)."""
    progress = ProgressBar(len(texts), unit="sentence", label=f"decoding {what}")
    outputs, _ = translate_texts(self.translator.translate_nbest, texts,
                                 self.config.eval_batch_size, progress)
    progress.close()
    return [nbest[0] for nbest in outputs]

  def dev_bleu(self) -> float:
    """BLEU of the model as it is on the first eval_sentences dev pairs (of each target
    language: their mean), 0 without any."""
    scored = self._score(self._dev_sets(), "dev")
    return _figures(scored)["bleu"] if scored else 0.0

  def _dev_sets(self) -> dict[str, list[tuple[str, str]]]:
    """{target language: (source, reference) pairs}: the first eval_sentences dev pairs."""
    return self.data.dev_pairs(self.config.eval_sentences)

  def _score(self, sets: dict[str, list[tuple[str, str]]], what: str) -> dict[str, _Scored]:
    """Translates each target language's sources and scores them against its references;
    languages without pairs are left out."""
    scored = {}
    sets = {lang: pairs for lang, pairs in sets.items() if pairs}
    for lang, pairs in sets.items():
      sources, references = zip(*pairs)
      hypotheses = self.translate(list(sources), what + _suffix(lang, sets))
      scored[lang] = _Scored(sources, references, hypotheses,
                             *metrics.corpus_bleu(hypotheses, list(references)),
                             *metrics.corpus_chrf(hypotheses, list(references)))
    return scored

  def evaluate(self, step: int) -> dict:
    """Dev loss, perplexity and accuracy over the dev set, BLEU and chrF on its first
    eval_sentences, and the evaluation's wall time; a few of the translations and the
    attention of the first dev sentences go to TensorBoard."""
    start = time.perf_counter()
    results = {}
    if self._dev_batches is not None:
      results.update(metrics.dev_loss(self._loss_statistics, self._dev_batches))
    scored = self._score(self._dev_sets(), "dev")
    results.update(_figures(scored))
    if scored:
      samples = [f"**source** {s}  \n**reference** {r}  \n**output** {h}"
                 for one in scored.values()
                 for s, r, h in list(zip(one.sources, one.references, one.hypotheses))[:_SAMPLES]]
      with self.writer.as_default(step=step):
        tf.summary.text("translations", "\n\n".join(samples))
        sources = next(iter(scored.values())).sources
        self._attention_images(list(sources[:_ATTENTION_SENTENCES]))
    results["eval_seconds"] = time.perf_counter() - start
    return results

  def _attention_images(self, sources: list[str]):
    """TensorBoard images "attention/N": the last decoder layer's cross-attention (mean over
    heads) behind each sentence's translation, target pieces down, source pieces across."""
    aligned = self.translator.align(tf.constant(sources))
    for index, source in enumerate(sources):
      pieces = attention_plot.real_tokens(aligned["source_tokens"][index].numpy(),
                                          aligned["target_tokens"][index].numpy(),
                                          aligned["attention"][index].numpy())
      png = attention_plot.heat_map_png(*pieces, title=source[:80])
      tf.summary.image(f"attention/{index + 1}", tf.image.decode_png(png)[tf.newaxis],
                       description=f"dev sentence {index + 1}: {source}")

  def evaluate_and_select(self, step: int) -> bool:
    """Evaluates, logs, keeps the checkpoint if its dev BLEU is the best so far.

    Returns:
      True when early_stopping evaluations in a row brought no better BLEU.
    """
    results = self.evaluate(step)
    with self.writer.as_default(step=step):
      for name, value in results.items():
        tf.summary.scalar(name, value)
    self.writer.flush()  # a dashboard open during training shows the evaluation at once
    logging.info("step %d dev: %s", step, " ".join(f"{k} {v:.4g}" for k, v in results.items()))
    if "bleu" not in results:
      return False
    if results["bleu"] > float(self.best_bleu.numpy()) and all_finite(self._model.weights):
      self.best_bleu.assign(results["bleu"])
      self.evals_without_improvement.assign(0)
      checkpoints.save(self.best_manager, step)
      logging.info("new best dev BLEU %.2f at step %d", results["bleu"], step)
    else:
      self.evals_without_improvement.assign_add(1)
    patience = self.config.early_stopping
    return bool(patience) and int(self.evals_without_improvement.numpy()) >= patience

  def test(self, output_dir: str, step: int, restore_best: bool = True) -> dict:
    """Scores the best checkpoint (if any; with `restore_best` False, the model as it is) on
    the test set, if there is one.

    Writes `test_hypotheses.txt` into `output_dir` (a multilingual task: one
    `test_hypotheses.{lang}.txt` per target language), and test_bleu and test_chrf to
    TensorBoard at `step`.

    Returns:
      {} without a test set; else test_bleu, test_bleu_text, bleu_signature, test_chrf,
      chrf_signature, test_beam_size. A multilingual task: test_bleu and test_chrf are the
      means over its target languages, and each language's figures have its suffix
      (test_bleu_fr, test_bleu_text_fr, test_chrf_fr).
    """
    sets = self.data.test_pairs()
    if not any(sets.values()):
      return {}
    if restore_best and self.best_manager.latest_checkpoint:
      checkpoints.restore(self.best_manager.checkpoint, self.best_manager.latest_checkpoint)
    scored = self._score(sets, "test")
    results = _figures(scored, "test_")
    for lang, one in scored.items():
      suffix = _suffix(lang, scored)
      path = os.path.join(output_dir, f"test_hypotheses{suffix.replace('_', '.')}.txt")
      with files.atomic_file(path) as f:
        f.write("".join(h + "\n" for h in one.hypotheses))
      logging.info("test%s: %s, chrF2 %.2f (%s); hypotheses in %s", suffix, one.bleu,
                   one.chrf.score, one.bleu_signature, path)
      results.update({f"test_bleu_text{suffix}": str(one.bleu),
                      "bleu_signature": one.bleu_signature,
                      "chrf_signature": one.chrf_signature})
    with self.writer.as_default(step=step):
      for name, value in results.items():
        if name.startswith(("test_bleu", "test_chrf")) and "text" not in name:
          tf.summary.scalar(name, value)
    self.writer.flush()
    return {**results, "test_beam_size": self.config.eval_beam_size}
