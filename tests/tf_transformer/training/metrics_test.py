"""Scoring: sacreBLEU's numbers, and one warning a run for references tokenized as shipped."""

import logging

import pytest
import sacrebleu

from tf_transformer.training import metrics

_TOKENIZED = [f"câu thứ {i} ." for i in range(150)]  # IWSLT'15 / JaViCorpus style


def _hypotheses():
  return [f"câu số {i} ." for i in range(150)]


def test_tokenized_references_warn_once_and_keep_sacrebleus_score(caplog, monkeypatch):
  monkeypatch.setattr(metrics, "_warned_tokenized", False)
  caplog.set_level(logging.WARNING)
  expected = sacrebleu.corpus_bleu(_hypotheses(), [_TOKENIZED]).score
  caplog.clear()  # sacreBLEU's own warnings of that reference score
  first, _ = metrics.corpus_bleu(_hypotheses(), _TOKENIZED)
  second, _ = metrics.corpus_bleu(_hypotheses(), _TOKENIZED)
  assert first.score == pytest.approx(expected) and second.score == pytest.approx(expected)
  ours = [r for r in caplog.records if "references are tokenized" in r.getMessage()]
  sacrebleus = [r for r in caplog.records if r.name == "sacrebleu"]
  assert len(ours) == 1 and not sacrebleus


def test_detokenized_references_do_not_warn(caplog, monkeypatch):
  monkeypatch.setattr(metrics, "_warned_tokenized", False)
  caplog.set_level(logging.WARNING)
  metrics.corpus_bleu(["A dog runs."] * 3, ["A dog runs."] * 3)
  assert not [r for r in caplog.records if "references are tokenized" in r.getMessage()]


def test_only_mostly_tokenized_text_counts_as_tokenized():
  assert metrics._looks_tokenized(["a dog .", "two cats .", "a bird"])
  assert not metrics._looks_tokenized(["A dog.", "Two cats.", "a bird ."])
  assert not metrics._looks_tokenized([])
