"""The files of an export: numbered version folders written atomically, each holding the
SavedModel, its warm-up requests and assets.extra/decoding.json (the settings fixed at export,
read back by `load()`), and the batching parameters file beside the versions.

Every file operation goes through tf.io.gfile, so the export dir may be on any file system
TensorFlow knows (a local path, file://, gs://, hdfs://).
"""

import dataclasses
import json

import tensorflow as tf
from absl import logging

from common import files
from tf_transformer.config import DecodeConfig
from tf_transformer.serving import signatures, warmup

BATCHING_PARAMETERS = "batching_parameters.txt"
SETTINGS = ("assets.extra", "decoding.json")


def next_version(export_dir: str, preferred: int) -> int:
  """`preferred` (the checkpoint step) unless taken, else one more than the largest version."""
  taken = [int(name) for name in tf.io.gfile.listdir(export_dir) if name.isdigit()] if (
      tf.io.gfile.isdir(export_dir)) else []
  return preferred if preferred not in taken and preferred > 0 else max(taken + [0]) + 1


def save_version(module, signatures: dict, export_dir: str, version: int, settings: dict,
                 batching=None) -> str:
  """Saves `module` as `{export_dir}/{version}`, complete or not at all.

  The SavedModel, its warm-up requests and `assets.extra/decoding.json` (the decoding settings
  fixed at export) are written into a temporary sibling folder that is renamed at the end, so a
  server polling `export_dir` never loads half a model. (On object stores such as gs:// a folder
  rename copies object by object, so there it is not atomic.)
  """
  final = tf.io.gfile.join(export_dir, str(version))
  tf.io.gfile.makedirs(export_dir)
  # TF Serving loads numeric folder names only: it never sees the temporary `<version>.tmp-*`
  with files.atomic_path(final, overwrite=False) as temporary:
    tf.saved_model.save(module, temporary, signatures=signatures)
    buckets = None
    if batching:  # the warm-up texts, and one for each width of the ladder they miss
      texts = warmup.WARMUP_INPUTS + (warmup.WARMUP_LONG_INPUT,)
      buckets = {**{text: module.source_bucket(text) for text in texts},
                 **module.ladder_texts(warmup.WARMUP_LONG_INPUT)}
    warmup.write_warmup_requests(temporary, list(signatures), batching, buckets)
    # the whole folder is renamed at the end: the file itself needs no temporary name
    with tf.io.gfile.GFile(tf.io.gfile.join(temporary, *SETTINGS), "w") as f:
      f.write(json.dumps(settings, indent=2))
  return final


def batching_parameters(max_batch_size: int) -> str:
  """TF Serving's BatchingParameters text proto for a Translator that decodes `max_batch_size`
  sentences at a time, each value explained by the comment line above it."""
  buckets = [2 ** i for i in range(max_batch_size.bit_length()) if 2 ** i < max_batch_size]
  sizes = "\n".join(f"allowed_batch_sizes: {size}" for size in buckets + [max_batch_size])
  return f"""\
# TF Serving batching for this model, read with --enable_batching --batching_parameters_file=.
# export_saved_model writes it when absent and never overwrites it: edit it freely.

# The search decodes {max_batch_size} sentences at a time (Translator.max_batch_size), so larger
# batches gain nothing. With batching on, TF Serving refuses a request of more rows than this.
max_batch_size {{ value: {max_batch_size} }}

# The XLA shape buckets of the search, which pads a batch to a power of two with copies of its
# first sentence as TF Serving does: a batch formed at these sizes is not padded a second time.
{sizes}

# Wait at most 5 ms for requests to join a batch: about a tenth of one sentence's beam search
# at small dims, while 32 sentences decoded together give 3x the tokens/s of one at a time.
batch_timeout_micros {{ value: 5000 }}

# Batches decoded side by side: one per core is the TF Serving guide's start on CPU, 4 a
# small server's; set it to yours (a beam search alone leaves cores idle between steps).
num_batch_threads {{ value: 4 }}

# Full batches allowed to wait (one per thread): beyond that a request fails fast with
# UNAVAILABLE instead of queueing for seconds behind full beam searches; retry it elsewhere.
max_enqueued_batches {{ value: 4 }}
"""


def write_batching_parameters(export_dir: str, max_batch_size: int) -> str:
  """Writes `{export_dir}/batching_parameters.txt` (beside the version folders) if absent.

  A file that differs, a user's edit or an older export's, is kept as it is and logged.

  Returns:
    The path of the file.
  """
  path = tf.io.gfile.join(export_dir, BATCHING_PARAMETERS)
  text = batching_parameters(max_batch_size)
  if not tf.io.gfile.exists(path):
    tf.io.gfile.makedirs(export_dir)
    try:
      with files.atomic_file(path, overwrite=False) as f:
        f.write(text)
      logging.info("wrote %s", path)
      return path
    except FileExistsError:  # another export wrote it meanwhile
      pass
  with tf.io.gfile.GFile(path) as f:
    if f.read() != text:
      logging.info("kept %s: it differs from this export's values (delete it to get them)", path)
  return path


def read_settings(saved_model: str) -> dict:
  """assets.extra/decoding.json of a SavedModel: the settings fixed at export ({} if absent)."""
  path = tf.io.gfile.join(saved_model, *SETTINGS)
  if not tf.io.gfile.exists(path):
    return {}
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def export_search(recorded: dict, loaded) -> DecodeConfig:
  """The search a SavedModel was exported with: its settings' (`read_settings`), or (an
  export without them) the beam size its translate_nbest returns, with the default alpha."""
  fields = {field.name for field in dataclasses.fields(DecodeConfig)}
  if recorded:
    if "max_length" in recorded:  # its name in exports before the sampling signatures
      recorded.setdefault("max_source_length", recorded["max_length"])
    return DecodeConfig(**{key: value for key, value in recorded.items() if key in fields})
  beam = loaded.signatures[signatures.NBEST].structured_outputs["outputs"].shape[1]
  return DecodeConfig(beam_size=beam or DecodeConfig.beam_size)
