"""The average_checkpoints command: the mean of the model weights of the last N checkpoints,
nothing else, loadable with --checkpoint=average, on any TensorFlow file system; one-line
errors."""

import concurrent.futures
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tests import testutil
from tests.tf_transformer.checkpoints_test import STEPS, write_checkpoints

from tf_transformer import checkpoints
from tf_transformer.checkpoints import average

LAST = 3
_EMBEDDING = "target_embedding/embeddings"  # a weight, by its path from the model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_model_dir):
  """A model directory with the 4 training checkpoints of model_dir_test.write_checkpoints."""
  folder = tmp_path_factory.mktemp("model")
  write_checkpoints(folder, tiny_model_dir)
  return folder


def _average_cli(model_dir, *args):
  return testutil.run_cli("tf_transformer.bin.average_checkpoints", f"--model_dir={model_dir}",
                          *args)


def _values(path) -> dict:
  """{path from the model, e.g. "encoder/layer_0/ffn/inner/bias": float64 array} of every
  variable of the checkpoint `path`'s `model`, wherever the checkpoint keys it: a training
  checkpoint keys the weights under the optimizer, which it reaches first."""
  reader = tf.train.load_checkpoint(str(path))
  graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(
      reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
  values, seen = {}, set()

  def visit(node_id, name):
    seen.add(node_id)
    for attribute in graph.nodes[node_id].attributes:
      if attribute.name == "VARIABLE_VALUE":
        values[name] = reader.get_tensor(attribute.checkpoint_key).astype(np.float64)
    for child in graph.nodes[node_id].children:
      if child.node_id not in seen:
        visit(child.node_id, f"{name}/{child.local_name}".lstrip("/"))

  model = [child.node_id for child in graph.nodes[0].children if child.local_name == "model"]
  visit(model[0], "")
  return values


def test_average_is_the_mean_of_the_last_checkpoints(model_dir):
  result = _average_cli(model_dir, f"--last={LAST}")
  assert result.returncode == 0, result.stderr
  path = model_dir / "average" / "ckpt-400"
  assert result.stdout.strip() == str(path)
  assert result.stderr.count("] read ") == LAST  # one INFO line per checkpoint read
  averaged = [_values(model_dir / f"ckpt-{step}") for step in STEPS[-LAST:]]
  got = _values(path)
  assert set(got) == set(averaged[0])
  for key, value in got.items():
    expected = sum(values[key] for values in averaged) / LAST  # in float64, in order
    assert not np.array_equal(value, averaged[-1][key])  # the checkpoints differ
    np.testing.assert_array_equal(value, expected.astype(np.float32), err_msg=key)
  # the model's weights only: no optimizer moment or step counter
  keys = tf.train.load_checkpoint(str(path)).get_variable_to_shape_map()
  assert not [key for key in keys if key.startswith("optimizer/")]
  assert json.loads((model_dir / "average" / "average.json").read_text()) == {
      "checkpoint": "ckpt-400", "averaged": ["ckpt-200", "ckpt-300", "ckpt-400"]}
  # --checkpoint=average loads it; a new average replaces it
  model, _, step = checkpoints.load_for_inference(str(model_dir), "en", "de", "average")
  assert step == 400 and len(got) == len(model.weights)  # every weight of the model
  np.testing.assert_array_equal(model.target_embedding.embeddings.numpy(),
                                got[_EMBEDDING].astype(np.float32))
  average(str(model_dir), 2)
  assert sorted(os.listdir(model_dir / "average")) == [
      "average.json", "checkpoint", "ckpt-400.data-00000-of-00001", "ckpt-400.index"]


def test_average_through_a_file_uri(model_dir, tmp_path):
  shutil.copytree(model_dir, tmp_path / "model", ignore=shutil.ignore_patterns("average"))
  uri = f"file://{tmp_path}/model"
  assert average(uri, 2) == f"{uri}/average/ckpt-400"
  model, _, step = checkpoints.load_for_inference(uri, "en", "de", "average")
  expected = np.mean([_values(tmp_path / "model" / f"ckpt-{step}")[_EMBEDDING]
                      for step in (300, 400)], axis=0)
  assert step == 400
  np.testing.assert_allclose(model.target_embedding.embeddings.numpy(), expected, rtol=1e-6)


def _no_checkpoint(folder):
  for path in folder.glob("ckpt-*"):
    path.unlink()
  (folder / "checkpoint").unlink()


def _truncate_300(folder):
  (folder / "ckpt-300.index").write_bytes(b"\0" * 10)


ERRORS = {
    "no checkpoints": ("--last=2", _no_checkpoint,
                       "error: {m}: no training checkpoint to average"),
    "fewer than --last": ("--last=5", None,
                          "error: {m}: --last=5, but its checkpoint file records 4 "
                          "checkpoint(s) (ckpt-100, ckpt-200, ckpt-300, ckpt-400); lower --last"),
    "--last=0": ("--last=0", None,
                 "error: flag --last=0: 0 is not a positive integer (see --helpfull)"),
    "unreadable checkpoint": ("--last=2", _truncate_300,
                              "error: {m}/ckpt-300: cannot restore this checkpoint (...); delete "
                              "it to resume from an earlier one, or use another --model_dir"),
}


def test_errors_are_one_line(model_dir, tmp_path):
  folders = {}
  for name, (_, prepare, _) in ERRORS.items():
    folders[name] = tmp_path / name.replace(" ", "_")
    shutil.copytree(model_dir, folders[name], ignore=shutil.ignore_patterns("average"))
    if prepare:
      prepare(folders[name])
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = {name: pool.submit(_average_cli, folders[name], flag)
               for name, (flag, _, _) in ERRORS.items()}
  for name, (_, _, message) in ERRORS.items():
    result = results[name].result()
    pattern = message.replace("{m}", str(folders[name]))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    # "..." stands for TensorFlow's own reason
    assert re.fullmatch(".*".join(map(re.escape, pattern.split("..."))), last), (name, last)
    assert not (folders[name] / "average").exists()
