"""The TF Serving layout: numbered version folders written atomically, and warm-up requests."""

import os
import shutil

import tensorflow as tf

from tf_transformer import model_dir

WARMUP_INPUTS = ("", "Hello.", "A man in a blue shirt is standing on a ladder cleaning windows.")


def next_version(export_dir: str, preferred: int) -> int:
  """`preferred` (the checkpoint step) unless taken, else one more than the largest version."""
  taken = [int(name) for name in tf.io.gfile.listdir(export_dir) if name.isdigit()] if (
      tf.io.gfile.isdir(export_dir)) else []
  return preferred if preferred not in taken and preferred > 0 else max(taken + [0]) + 1


def write_warmup_requests(version_dir: str, inputs=WARMUP_INPUTS):
  """assets.extra/tf_serving_warmup_requests: PredictionLog records for serving_default.

  TF Serving replays them at load, so the first real request does not pay for graph warm-up.
  """
  from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

  path = os.path.join(version_dir, "assets.extra", "tf_serving_warmup_requests")
  tf.io.gfile.makedirs(os.path.dirname(path))
  with tf.io.TFRecordWriter(path) as writer:
    for batch in (1, 8):
      request = predict_pb2.PredictRequest(
          model_spec=model_pb2.ModelSpec(signature_name="serving_default"))
      texts = [inputs[i % len(inputs)] for i in range(batch)]
      request.inputs["inputs"].CopyFrom(tf.make_tensor_proto(texts, dtype=tf.string))
      log = prediction_log_pb2.PredictionLog(
          predict_log=prediction_log_pb2.PredictLog(request=request))
      writer.write(log.SerializeToString())
  return path


def save_version(module, signatures: dict, export_dir: str, version: int, settings: dict) -> str:
  """Saves `module` as `{export_dir}/{version}`, complete or not at all.

  The SavedModel, its warm-up requests and `assets.extra/decoding.json` (the decoding settings
  fixed at export) are written into a temporary sibling folder that is renamed at the end, so a
  server polling `export_dir` never loads half a model.
  """
  final = os.path.join(export_dir, str(version))
  temporary = os.path.join(export_dir, f".tmp-{version}")
  if tf.io.gfile.exists(temporary):
    tf.io.gfile.rmtree(temporary)
  tf.io.gfile.makedirs(export_dir)
  try:
    tf.saved_model.save(module, temporary, signatures=signatures)
    write_warmup_requests(temporary)
    model_dir.write_json(os.path.join(temporary, "assets.extra", "decoding.json"), settings)
    os.replace(temporary, final)
  finally:
    if os.path.exists(temporary):
      shutil.rmtree(temporary)
  return final
