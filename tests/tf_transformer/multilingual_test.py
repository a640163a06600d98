"""One model, two target languages (Johnson et al. 2017): a tiny model learns to reverse a word
string into "rv" and to copy it into "cp", the token before the source choosing which; each
language is scored on its own dev and test sets, and translation chooses the language in
Python, in the translate CLI and in the SavedModel."""

import json

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from data_pipeline.language_tags import LanguageError
from tests import testutil
from tf_transformer import loading

LANGS = ("rv", "cp")


def _write_task(folder, prefix, lines, seed):
  """{prefix}.src, {prefix}.rv (the words reversed) and {prefix}.cp (the words as they are)."""
  pairs = testutil.write_word_task(folder, prefix, lines, seed)  # writes .src and .tgt
  testutil.write_lines(folder / f"{prefix}.rv", [target for _, target in pairs])
  testutil.write_lines(folder / f"{prefix}.cp", [source for source, _ in pairs])
  return [source for source, _ in pairs]


@pytest.fixture(scope="module")
def multilingual_model(tmp_path_factory):
  """(model folder, test sources, the run's results): tiny.cfg in float32, 600 steps."""
  folder = tmp_path_factory.mktemp("multilingual")
  _write_task(folder, "train", 600, seed=0)
  _write_task(folder, "val", 30, seed=1)
  sources = _write_task(folder, "test", 30, seed=2)
  result = testutil.run_cli(
      "tf_transformer.train", "--flagfile=flags/tiny.cfg", f"--data_dir={folder}",
      f"--model_dir={folder / 'model'}", "--src_lang=src", "--tgt_lang=rv,cp",
      "--test_prefix=test", "--train_steps=600", "--eval_every=200", "--save_every=200",
      "--mixed_precision=float32", timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return folder / "model", sources, json.loads(result.stdout.strip().splitlines()[-1])


def _references(sources, lang):
  return [" ".join(reversed(s.split())) if lang == "rv" else s for s in sources]


def _bleu(hypotheses, references):
  return sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score


def test_each_language_is_learned_and_scored_on_its_own(multilingual_model):
  model_dir, sources, results = multilingual_model
  for lang in LANGS:
    hypotheses = (model_dir / f"test_hypotheses.{lang}.txt").read_text().splitlines()
    own = _bleu(hypotheses, _references(sources, lang))
    other = _bleu(hypotheses, _references(sources, "cp" if lang == "rv" else "rv"))
    assert results[f"test_bleu_{lang}"] == pytest.approx(own)
    # the token chose the task: its own references score high, the other task's low
    assert own >= 60 and other <= own - 30, (lang, own, other)
  assert results["test_bleu"] == pytest.approx(
      (results["test_bleu_rv"] + results["test_bleu_cp"]) / 2)
  assert not (model_dir / "test_hypotheses.txt").exists()
  # the dev BLEU that chose the final weights is the mean over the languages
  final = json.loads((model_dir / "final.json").read_text())
  chosen = results[f"dev_bleu_{final['choice']}"]
  assert 0 < chosen <= 100
  from tests.tf_transformer.training.trainer_test import summaries
  logged = summaries(model_dir / "eval")
  for step in (200, 400, 600):
    at = {name: dict(values)[step] for name, values in logged.items()
          if name in ("bleu", "bleu_rv", "bleu_cp")}
    assert at["bleu"] == pytest.approx((at["bleu_rv"] + at["bleu_cp"]) / 2, rel=1e-5)


def test_python_api_translates_into_the_language_asked_for(multilingual_model):
  model_dir, sources, _ = multilingual_model
  model = loading.load(str(model_dir))
  assert model.languages == LANGS and model.target_language is None
  for lang in LANGS:
    # the evaluation's search (beam 4) and weights: the run's test hypotheses
    assert model.translate(sources, target_language=lang) == (
        model_dir / f"test_hypotheses.{lang}.txt").read_text().splitlines()
  with pytest.raises(LanguageError, match=r"translates into rv, cp: choose one"):
    model.translate(sources[:1])
  with pytest.raises(LanguageError, match=r"translates into rv, cp, not 'de'"):
    model.translate(sources[:1], target_language="de")
  assert loading.load(str(model_dir), tgt_lang="cp").translate(sources[:5]) == \
      model.translate(sources[:5], target_language="cp")
  # scores: a reversal is likelier asked for in rv than in cp
  reversed_texts = _references(sources, "rv")
  as_rv = model.score(sources, reversed_texts, target_language="rv")
  as_cp = model.score(sources, reversed_texts, target_language="cp")
  assert np.mean(as_rv) > np.mean(as_cp) + 1.0
  # alignments index the sentence's own pieces, not the token before it
  texts, alignments = model.align(sources[:5], target_language="cp")
  pieces = model.count_tokens(sources[:5])  # pieces + </s>
  offsets = []
  for source_text, text, pairs, count in zip(sources, texts, alignments, pieces):
    assert pairs and all(0 <= source < count for source, _ in pairs)
    if text == source_text:  # copied: piece i aligns near piece i (2 further with the token's)
      offsets += [source - target for source, target in pairs]
  assert offsets and abs(np.mean(offsets)) < 1.0, offsets


def test_translate_cli_and_saved_model_take_the_language(multilingual_model, tmp_path):
  model_dir, sources, _ = multilingual_model
  source_file = testutil.write_lines(tmp_path / "in.txt", sources)
  expected = (model_dir / "test_hypotheses.cp.txt").read_text().splitlines()
  common = ("--flagfile=flags/tiny.cfg", f"--model_dir={model_dir}", "--src_lang=src",
            "--beam_size=4")
  result = testutil.run_cli("tf_transformer.bin.translate", *common, "--tgt_lang=cp",
                            f"--input={source_file}", f"--output={tmp_path / 'out.txt'}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert (tmp_path / "out.txt").read_text().splitlines() == expected
  result = testutil.run_cli("tf_transformer.bin.translate", *common, "--tgt_lang=rv,cp",
                            f"--input={source_file}")
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: {model_dir} translates into rv, cp: choose one (--tgt_lang or target_language)")

  export_dir = tmp_path / "export"
  result = testutil.run_cli("tf_transformer.bin.export_saved_model", *common,
                            "--tgt_lang=rv,cp", f"--export_dir={export_dir}", "--nodecode_jit",
                            "--signatures=translate_nbest,serving_default")
  assert result.returncode == 0, result.stderr[-3000:]
  (version,) = [path for path in export_dir.iterdir() if path.name.isdigit()]
  settings = json.loads((version / "assets.extra" / "decoding.json").read_text())
  assert settings["tgt_lang"] == "rv,cp"
  saved = loading.load(str(version))
  assert saved.languages == LANGS
  assert saved.translate(sources, target_language="cp") == expected
  assert loading.load(str(version), tgt_lang="rv").translate(sources) == (
      model_dir / "test_hypotheses.rv.txt").read_text().splitlines()
  with pytest.raises(LanguageError, match="choose one"):
    saved.translate(sources[:1])
  # TF Serving's clients put the token in the text themselves
  loaded = tf.saved_model.load(str(version))
  outputs = loaded.signatures["serving_default"](inputs=tf.constant(
      [f"<2cp> {source}" for source in sources[:5]]))
  assert [text.decode() for text in outputs["outputs"].numpy()] == expected[:5]
