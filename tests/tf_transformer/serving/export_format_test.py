"""tf_transformer/serving/export_format.py: the batching parameters file, and writes through
tf.io.gfile to a URI."""

import inspect

import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf import wrappers_pb2

from tf_transformer.serving import export_format
from tests import testutil
from tf_transformer.serving.translator import Translator

# BatchingParameters of tensorflow_serving/servables/tensorflow/session_bundle_config.proto (the
# Python package tensorflow-serving-api does not ship it): name -> (number, type, wrapper type)
_F = descriptor_pb2.FieldDescriptorProto
_BATCHING_FIELDS = {
    "max_batch_size": (1, _F.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
    "batch_timeout_micros": (2, _F.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
    "max_enqueued_batches": (3, _F.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
    "num_batch_threads": (4, _F.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
    "thread_pool_name": (5, _F.TYPE_MESSAGE, ".google.protobuf.StringValue"),
    "allowed_batch_sizes": (6, _F.TYPE_INT64, None),
    "pad_variable_length_inputs": (7, _F.TYPE_BOOL, None),
}


def _batching_parameters_class():
  """The BatchingParameters message class, built from its descriptor."""
  proto = descriptor_pb2.FileDescriptorProto(
      name="serving_test/batching.proto", package="serving_test", syntax="proto3",
      dependency=["google/protobuf/wrappers.proto"])
  message = proto.message_type.add(name="BatchingParameters")
  for name, (number, kind, type_name) in _BATCHING_FIELDS.items():
    label = _F.LABEL_REPEATED if name == "allowed_batch_sizes" else _F.LABEL_OPTIONAL
    message.field.add(name=name, number=number, type=kind, label=label, type_name=type_name)
  pool = descriptor_pool.DescriptorPool()
  pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
  pool.Add(proto)
  return message_factory.GetMessageClass(
      pool.FindMessageTypeByName("serving_test.BatchingParameters"))


def parse_batching_parameters(text: str):
  """`text` parsed as TF Serving parses --batching_parameters_file (a text proto)."""
  return text_format.Parse(text, _batching_parameters_class()())


def test_batching_parameters_match_the_translator_and_explain_each_value():
  translator_batch = inspect.signature(Translator).parameters["max_batch_size"].default
  text = export_format.batching_parameters(translator_batch)
  parameters = parse_batching_parameters(text)
  assert parameters.max_batch_size.value == translator_batch == 64
  # Translator._decode pads a batch to the next power of two: the server forms the same shapes
  assert list(parameters.allowed_batch_sizes) == [1, 2, 4, 8, 16, 32, 64]
  assert 0 < parameters.batch_timeout_micros.value <= 10_000
  assert parameters.num_batch_threads.value >= 1 and parameters.max_enqueued_batches.value >= 1
  lines = text.splitlines()
  for index, line in enumerate(lines):
    if line and not line.startswith("#") and not lines[index - 1].startswith("allowed_"):
      assert lines[index - 1].startswith("# "), f"no comment explains {line!r}"
  # TF Serving's rule: the last allowed size is max_batch_size, also when not a power of two
  parameters = parse_batching_parameters(export_format.batching_parameters(48))
  assert list(parameters.allowed_batch_sizes) \
      == [1, 2, 4, 8, 16, 32, 48]


def test_batching_parameters_file_is_written_once_and_an_edit_is_kept(tmp_path, caplog,
                                                                     monkeypatch):
  testutil.capture_absl_info(caplog, monkeypatch)
  export_dir = f"file://{tmp_path}/model"  # through tf.io.gfile: a URI works like a path
  path = export_format.write_batching_parameters(export_dir, 64)
  assert path == f"{export_dir}/batching_parameters.txt"
  written = tmp_path / "model" / "batching_parameters.txt"
  assert written.read_text() == export_format.batching_parameters(64)
  assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["batching_parameters.txt"]

  export_format.write_batching_parameters(export_dir, 64)  # the same: nothing to say
  assert "kept" not in caplog.text
  edited = written.read_text().replace("value: 5000", "value: 1000")
  written.write_text(edited)
  export_format.write_batching_parameters(export_dir, 64)
  assert written.read_text() == edited
  assert f"kept {path}" in caplog.text
  assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["batching_parameters.txt"]


class _Echo(tf.Module):

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
  def serve(self, inputs):
    return {"outputs": inputs}


def test_failed_export_to_a_uri_leaves_no_partial_version(tmp_path):
  module = _Echo()
  signatures = {"serving_default": module.serve.get_concrete_function()}
  export_dir = f"file://{tmp_path}/model"
  with pytest.raises(TypeError, match="not JSON serializable"):
    export_format.save_version(module, signatures, export_dir, 3, {"bad": object()})
  assert list((tmp_path / "model").iterdir()) == []  # neither 3/ nor its temporary 3.tmp-*/

  assert export_format.save_version(module, signatures, export_dir, 3, {}) == f"{export_dir}/3"
  assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["3"]
  loaded = tf.saved_model.load(f"{export_dir}/3").signatures["serving_default"]
  assert loaded(inputs=tf.constant(["a"]))["outputs"].numpy().tolist() == [b"a"]
  assert export_format.next_version(export_dir, 3) == 4
