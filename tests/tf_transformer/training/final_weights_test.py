"""The run's final weights, chosen by dev BLEU among the best checkpoint, the average of the last
checkpoints and the moving average: each wins when dev prefers it, and the run, translate and
the test score use the winner."""

import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import testutil
from tf_transformer import checkpoints
from tf_transformer.training import final_weights, metrics
from tf_transformer import length_batching
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import DecodeConfig
from tf_transformer.model import build_model
from tf_transformer.serving.translator import Translator


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
  assert json.loads(scored.stdout.strip().splitlines()[-1])["bleu"] == results["test_bleu"], (
      scored.stderr[-3000:])


def _dev_bleu(model, vocabulary, dev):
  translator = Translator(model, vocabulary, DecodeConfig(beam_size=1, extra_decode_length=8))
  sources, references = (list(side) for side in zip(*dev))

  def score():
    outputs, _ = length_batching.translate_texts(translator.translate_nbest, sources)
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
  model, vocabulary, _ = checkpoints.load_for_inference(str(folder), "src", "tgt", "latest")
  chosen, scores = final_weights.choose(model, _dev_bleu(model, vocabulary, dev), paths)
  assert chosen == winner, scores
  assert scores[winner] > 25 and all(scores[name] < 10 for name in scores if name != winner)
  # the winner's weights stay in the model
  want = build_model(config)
  checkpoints.restore(tf.train.Checkpoint(model=want), paths[winner], partial=True)
  for got, expected in zip(model.weights, want.weights):
    assert (got.numpy() == expected.numpy()).all()


def constant_checkpoints(folder, config, values: dict) -> dict:
  """Writes a model-only checkpoint `folder`/<subfolder>/ckpt-<step> for each (subfolder, step)
  of `values` ("" for `folder` itself), every weight set to its value, recorded in its folder's
  checkpoint state as training records its checkpoints; returns {(subfolder, step): path}."""
  model = build_model(config)
  paths = {}
  for (subfolder, step), value in values.items():
    for weight in model.weights:
      weight.assign(np.full(weight.shape, value, weight.dtype))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                                         str(folder / subfolder), max_to_keep=10,
                                         checkpoint_name="ckpt")
    paths[subfolder, step] = manager.save(checkpoint_number=step)
  return paths


def weight_value(model) -> float:
  """The value every weight of a model restored from constant_checkpoints holds."""
  return float(model.weights[0].numpy().flat[0])


@pytest.mark.parametrize("best, average, ema, winner", [
    (20.0, 20.0, 20.0, "best"), (10.0, 20.0, 20.0, "average"), (20.0, 10.0, 20.0, "best"),
    (10.0, 10.0, 20.0, "ema"), (20.0, 30.0, 10.0, "average")])
def test_a_tie_goes_to_best_then_average(tiny_model_dir, tmp_path, best, average, ema, winner):
  """The highest dev BLEU wins; equal scores go to best, then average, then the moving
  average, in whatever order the candidates come; the winner's weights stay in the model."""
  config = model_dir_lib.read_config(str(tiny_model_dir))
  values = {"best": 1.0, "average": 2.0, "ema": 3.0}
  written = constant_checkpoints(tmp_path, config, {(name, 4): value
                                                    for name, value in values.items()})
  bleu = {values["best"]: best, values["average"]: average, values["ema"]: ema}
  model = build_model(config)
  paths = {name: written[name, 4] for name in ("ema", "average", "best")}
  chosen, scores = final_weights.choose(model, lambda: bleu[weight_value(model)], paths)
  assert chosen == winner
  assert scores == {"best": best, "average": average, "ema": ema}
  assert weight_value(model) == values[winner]


def test_the_average_is_of_the_newest_min_of_average_last_and_kept(tiny_model_dir, tmp_path):
  """The "average" candidate averages the min(--average_last, kept) newest training
  checkpoints, and there is none when that is under 2."""
  config = model_dir_lib.read_config(str(tiny_model_dir))
  folder = tmp_path / "model"
  model_dir_lib.check_config(str(folder), config)
  constant_checkpoints(folder, config, {("", 1): 1.0, ("", 2): 2.0, ("", 3): 6.0})
  model = build_model(config)
  # kept 3: --average_last=5 averages all three, 2 the newest two, 1 none
  for average_last, averaged, mean in ((5, ["ckpt-1", "ckpt-2", "ckpt-3"], 3.0),
                                       (2, ["ckpt-2", "ckpt-3"], 4.0)):
    paths = final_weights.candidates(str(folder), average_last)
    assert paths == {"average": str(folder / "average" / "ckpt-3")}
    record = json.loads((folder / "average" / "average.json").read_text())
    assert record["averaged"] == averaged
    checkpoints.restore(tf.train.Checkpoint(model=model), paths["average"], partial=True)
    assert all((weight.numpy() == mean).all() for weight in model.weights)
  assert final_weights.candidates(str(folder), 1) == {}
  # one checkpoint kept: nothing to average, whatever --average_last
  single = tmp_path / "single"
  model_dir_lib.check_config(str(single), config)
  constant_checkpoints(single, config, {("", 1): 1.0})
  assert final_weights.candidates(str(single), 3) == {}
