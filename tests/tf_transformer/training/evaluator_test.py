"""Tests of tf_transformer/training/evaluator.py: best checkpoint by dev BLEU, early stopping, test score."""

import os
import types

import numpy as np
import sacrebleu
import tensorflow as tf

from tf_transformer import checkpoints
from tf_transformer.config import DecodeConfig, TrainConfig
from tf_transformer.training.evaluator import Evaluator


def _evaluator(tiny_model_dir, tmp_path, test_pairs=(), **train_flags):
  model, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "src", "tgt")
  data = types.SimpleNamespace(vocabulary=vocabulary, dev_batches=lambda: None,
                               dev_pairs=lambda limit: {},
                               test_pairs=lambda: {"tgt": list(test_pairs)})
  config = TrainConfig(model_dir=str(tmp_path), eval_beam_size=1, **train_flags)
  return model, Evaluator(model, data, config, DecodeConfig(), str(tmp_path / "best"),
                          tf.summary.create_noop_writer())


def test_keeps_the_weights_of_the_best_bleu_and_stops_after_patience(tiny_model_dir, tmp_path):
  model, evaluator = _evaluator(tiny_model_dir, tmp_path, early_stopping=2)
  bleu_by_step = {10: 10.0, 20: 12.0, 30: 11.0, 40: 12.0}
  evaluator.evaluate = lambda step: {"bleu": bleu_by_step[step]}
  variable = model.target_embedding.embeddings
  stops = []
  for step in bleu_by_step:
    variable.assign(tf.fill(variable.shape, float(step)))  # the weights "at" this step
    stops.append(evaluator.evaluate_and_select(step))
  # 10, then 12 (best), one worse, then 12 again: no gain, the second evaluation without one
  assert stops == [False, False, False, True]
  assert float(evaluator.best_bleu.numpy()) == 12.0
  assert int(evaluator.evals_without_improvement.numpy()) == 2
  assert os.path.basename(evaluator.best_manager.latest_checkpoint) == "ckpt-20"
  checkpoints.restore(evaluator.best_manager.checkpoint, evaluator.best_manager.latest_checkpoint)
  np.testing.assert_array_equal(variable.numpy(), 20.0)


def test_no_early_stopping_without_patience(tiny_model_dir, tmp_path):
  _, evaluator = _evaluator(tiny_model_dir, tmp_path, early_stopping=0)
  evaluator.evaluate = lambda step: {"bleu": 5.0}
  assert not any(evaluator.evaluate_and_select(step) for step in range(1, 6))


def test_test_score_writes_the_hypotheses(tiny_model_dir, tmp_path):
  pairs = [("aa bb", "aa bb"), ("cc dd ee", "cc dd ee")]
  _, evaluator = _evaluator(tiny_model_dir, tmp_path, test_pairs=pairs)
  results = evaluator.test(str(tmp_path), 1)
  hypotheses = (tmp_path / "test_hypotheses.txt").read_text().splitlines()
  assert hypotheses == evaluator.translate([source for source, _ in pairs])
  bleu = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [[ref for _, ref in pairs]])
  assert results["test_bleu"] == bleu.score and results["test_beam_size"] == 1
