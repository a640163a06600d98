"""The run's final weights, chosen by dev BLEU among the best checkpoint, the average of the last
checkpoints and the moving average: each wins when dev prefers it, and the run, translate and
the test score use the winner."""

import json
import shutil

import keras
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer import checkpoints, final_weights, inference, metrics
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.model import build_model
from tf_transformer.translator import Translator


def test_the_run_records_every_dev_score_and_keeps_the_winner(reversal_model):
  model_dir, _, results = reversal_model
  final = json.loads((model_dir / "final.json").read_text())
  scores = final["dev_bleu"]
  assert set(scores) == {"best", "average", "ema"}
  assert final["choice"] == results["final_weights"]
  assert scores[final["choice"]] == max(scores.values())
  assert {name: results[f"dev_bleu_{name}"] for name in scores} == scores
  # translate's default (--checkpoint=final) is the winner's checkpoint
  assert checkpoints.choose_checkpoint(str(model_dir)) == str(model_dir / final["checkpoint"])
  assert checkpoints.choose_checkpoint(str(model_dir), final["choice"]) == \
      checkpoints.choose_checkpoint(str(model_dir))
  # the run's test score is the winner's: evaluate's default weights, with the same search
  data = model_dir.parent
  scored = testutil.run_cli(
      "tf_transformer.bin.evaluate", "--flagfile=flags/tiny.cfg", f"--model_dir={model_dir}",
      "--src_lang=src", "--tgt_lang=tgt", f"--src={data / 'test.src'}",
      f"--ref={data / 'test.tgt'}", f"--output={data / 'hypotheses.txt'}")
  assert scored.returncode == 0, scored.stderr
  assert json.loads(scored.stdout.strip().splitlines()[-1])["bleu"] == results["test_bleu"], scored.stderr[-3000:]


def _dev_bleu(model, vocabulary, dev):
  translator = Translator(model, vocabulary, beam_size=1, nbest=1, extra_decode_length=8)
  sources, references = (list(side) for side in zip(*dev))

  def score():
    outputs, _ = inference.translate_texts(translator.translate_nbest, sources)
    return metrics.corpus_bleu([nbest[0] for nbest in outputs], references)[0].score
  return score


@pytest.mark.parametrize("winner", ["best", "average", "ema"])
def test_dev_prefers_each_candidate_in_turn(reversal_model, tmp_path, winner):
  model_dir, dev, _ = reversal_model
  folder = tmp_path / "model"
  shutil.copytree(model_dir, folder)
  config = model_dir_lib.read_config(str(folder))
  keras.utils.set_random_seed(7)
  untrained = tf.train.Checkpoint(model=build_model(config))
  untrained.save_counter  # pylint: disable=pointless-statement  (created: saved as the run's are)
  # the other two candidates get an untrained model's weights ("average" is made from the
  # training checkpoints)
  losers = {"best": [checkpoints.choose_checkpoint(str(folder), "best")],
            "ema": [checkpoints.choose_checkpoint(str(folder), "ema")],
            "average": checkpoints.training_checkpoints(str(folder))}
  for name, paths in losers.items():
    if name != winner:
      for path in paths:
        untrained.write(path)
  paths = final_weights.candidates(str(folder), average_last=3)
  assert set(paths) == {"best", "average", "ema"}
  model, vocabulary, _ = inference.load_for_inference(str(folder), "src", "tgt", "latest")
  chosen, scores = final_weights.choose(model, _dev_bleu(model, vocabulary, dev), paths)
  assert chosen == winner, scores
  assert scores[winner] > 25 and all(scores[name] < 10 for name in scores if name != winner)
  # the winner's weights stay in the model
  want = build_model(config)
  checkpoints.restore(tf.train.Checkpoint(model=want), paths[winner], partial=True)
  for got, expected in zip(model.weights, want.weights):
    assert (got.numpy() == expected.numpy()).all()
