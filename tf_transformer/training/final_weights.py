"""The weights a run keeps at its end, chosen by dev BLEU alone.

Three candidates compete: the best checkpoint by dev BLEU during training, the average of the
last average_last training checkpoints, and the moving average of the weights (with
an ema_decay). Each is scored on the dev set with the evaluation search; the winner is recorded
in final.json, which the checkpoint "final" (the default of translate, evaluate and the exports)
loads, and the test set is scored once, with the winner. No test score enters the choice.
"""

import os

import tensorflow as tf
from absl import logging

from tf_transformer import checkpoints
from tf_transformer import model_dir as model_dir_lib

CANDIDATES = ("best", "average", "ema")  # a tie goes to the earlier


def candidates(model_dir: str, average_last: int) -> dict:
  """{name: checkpoint path} of the candidates `model_dir` has; "average" is written now
  (model_dir/average, as average_checkpoints writes it) from the min(average_last, kept)
  newest training checkpoints, when that is 2 or more."""
  paths = {"best": checkpoints.latest_checkpoint(os.path.join(model_dir, "best")),
           "ema": checkpoints.latest_checkpoint(os.path.join(model_dir, checkpoints.EMA_DIR))}
  count = min(average_last, len(checkpoints.training_checkpoints(model_dir)))
  if count >= 2:
    paths["average"] = checkpoints.average(model_dir, count)
  return {name: paths[name] for name in CANDIDATES if paths.get(name)}


def choose(model, dev_bleu, paths: dict) -> tuple[str, dict]:
  """Scores each candidate on dev and leaves the winner's weights in `model`.

  Args:
    model: the Transformer whose weights are replaced by each candidate's in turn.
    dev_bleu: fn() -> the dev BLEU of `model` as it is.
    paths: {name: checkpoint path}, names from CANDIDATES.

  Returns:
    (the winner's name, {name: dev BLEU}).
  """
  checkpoint = tf.train.Checkpoint(model=model)
  scores = {}
  for name, path in paths.items():
    checkpoints.restore(checkpoint, path, partial=True)
    scores[name] = dev_bleu()
    logging.info("final weights: %s (%s) dev BLEU %.2f", name, path, scores[name])
  winner = max(paths, key=lambda name: (scores[name], -CANDIDATES.index(name)))
  checkpoints.restore(checkpoint, paths[winner], partial=True)
  logging.info("final weights: %s, chosen by dev BLEU", winner)
  return winner, scores


def record(model_dir: str, winner: str, path: str, scores: dict, step: int):
  """Writes final.json: the choice, its checkpoint (relative to `model_dir`) and every score."""
  model_dir_lib.write_json(os.path.join(model_dir, checkpoints.FINAL_FILE), {
      "choice": winner, "checkpoint": os.path.relpath(path, model_dir), "step": step,
      "dev_bleu": scores})
