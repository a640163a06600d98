"""A trained model as a TF Serving model: numbered version folders written atomically, warm-up
requests for every signature, and the batching parameters beside the versions; the tool is
tf_transformer/bin/export_saved_model.py.

Every file operation goes through tf.io.gfile, so the export dir may be on any file system
TensorFlow knows (a local path, file://, gs://, hdfs://).
"""

import dataclasses
import json

import tensorflow as tf
from absl import logging

from common import files
from data_pipeline import lexical_shortlist
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.checkpoints import load_ensemble_for_inference, load_for_inference
from tf_transformer.translator import Translator

WARMUP_INPUTS = ("", "Hello.", "A man in a blue shirt is standing on a ladder cleaning windows.")
WARMUP_BATCH_SIZES = (1, 8)
# The forced prefix of every warm-up request: a few pieces, the narrowest prefix bucket
WARMUP_PREFIX = WARMUP_INPUTS[1]
# With in-graph batching, also a text of about 30 subword pieces (an 8k vocabulary of English),
# the width of most merged batches of sentences
WARMUP_LONG_INPUT = ("Two young, White males are outside near many bushes. Several men in hard "
                     "hats are operating a giant pulley system.")
BATCHING_PARAMETERS = "batching_parameters.txt"


def next_version(export_dir: str, preferred: int) -> int:
  """`preferred` (the checkpoint step) unless taken, else one more than the largest version."""
  taken = [int(name) for name in tf.io.gfile.listdir(export_dir) if name.isdigit()] if (
      tf.io.gfile.isdir(export_dir)) else []
  return preferred if preferred not in taken and preferred > 0 else max(taken + [0]) + 1


def _warmup_log(signature_name: str, specs, texts):
  """A PredictionLog of one request to `signature_name` giving `texts` to each string input
  of `specs` (its tf.TensorSpecs) but the forced prefixes, WARMUP_PREFIX each, and the
  constraints, "" each (`_warmup_batches`), and the numbers 0, 1, ... to each integer one (the
  seeds)."""
  from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

  request = predict_pb2.PredictRequest(
      model_spec=model_pb2.ModelSpec(signature_name=signature_name))
  for spec in specs:
    values = texts if spec.dtype == tf.string else list(range(len(texts)))
    if spec.name == "constraints":
      values = [""] * len(texts)
    if spec.name == "prefix":
      values = [WARMUP_PREFIX] * len(texts)
    request.inputs[spec.name].CopyFrom(tf.make_tensor_proto(values, dtype=spec.dtype))
  return prediction_log_pb2.PredictionLog(
      predict_log=prediction_log_pb2.PredictLog(request=request))


def _warmup_batches(signatures: dict, batching,
                    buckets=None) -> list[tuple[str, list[str]]]:
  """(signature name, texts) of each warm-up request: WARMUP_BATCH_SIZES rows of the cycled
  WARMUP_INPUTS for each signature. With `batching` (config.BatchingConfig) instead, for each
  of Translator.PROGRAM_SIGNATURES, each allowed batch size of rows, all one text, for one text
  of each source bucket among those of `buckets` ({text: Translator.source_bucket(text)}): its
  merged searches run at those sizes, and a batch is as wide as its widest text, so every merge
  of texts as wide as these is compiled at load; the other batched signatures, whose searches
  run those programs, one row each.

  The forced prefixes are WARMUP_PREFIX (`_warmup_log`), of the narrowest prefix bucket: the
  searches with a prefix then run the programs of those without one (a merged batch of longer
  prefixes compiles its width the first time, as a longer source does). The constraints are
  "": the narrow constrained search (translator `_constraint_width`); the wide one compiles at
  a batch size the first time a request of wider constraints runs there, not at load, where at
  base dims it would add a third to the programs and their memory mappings (docs/serving.md)."""
  requests = []
  for name in signatures:
    if batching and name in Translator.PROGRAM_SIGNATURES:
      widths = {}
      for text in sorted(buckets, key=lambda text: not text):  # non-empty texts first
        widths.setdefault(buckets[text], text)
      batches = [[text] * size for size in batching.allowed_batch_sizes
                 for text in widths.values()]
    elif batching and name in Translator.BATCHED_SIGNATURES:
      batches = [[WARMUP_PREFIX]]
    else:
      batches = [[WARMUP_INPUTS[i % len(WARMUP_INPUTS)] for i in range(batch)]
                 for batch in WARMUP_BATCH_SIZES]
    requests += [(name, texts) for texts in batches]
  return requests


def write_warmup_requests(version_dir: str, signatures: dict, batching=None,
                          buckets=None) -> str:
  """assets.extra/tf_serving_warmup_requests: PredictionLog records of the requests of
  `_warmup_batches` (a 1-row and an 8-row request to each signature without batching).

  TF Serving replays them at load, before it takes traffic, so the first real request to any
  signature does not pay for its tracing or for the XLA compilation of those batch buckets.

  Args:
    version_dir: the SavedModel folder.
    signatures: {signature name: concrete function}, as saved; every input is [None], strings
      or integers (`score` gets the texts as both source and target).
    batching: the export's config.BatchingConfig, or None.
    buckets: with `batching`, the candidate texts of the batched signatures' warm-ups and
      their source buckets, {text: Translator.source_bucket(text)}.

  Returns:
    The path of the records file.
  """
  path = tf.io.gfile.join(version_dir, "assets.extra", "tf_serving_warmup_requests")
  tf.io.gfile.makedirs(tf.io.gfile.join(version_dir, "assets.extra"))
  with tf.io.TFRecordWriter(path) as writer:
    for name, texts in _warmup_batches(signatures, batching, buckets):
      specs = tf.nest.flatten(signatures[name].structured_input_signature)
      writer.write(_warmup_log(name, specs, texts).SerializeToString())
  return path


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
    buckets = {text: module.source_bucket(text)
               for text in WARMUP_INPUTS + (WARMUP_LONG_INPUT,)} if batching else None
    write_warmup_requests(temporary, signatures, batching, buckets)
    # the whole folder is renamed at the end: the file itself needs no temporary name
    with tf.io.gfile.GFile(tf.io.gfile.join(temporary, "assets.extra", "decoding.json"), "w") as f:
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


def export(model_dir, src_lang: str, tgt_lang: str, export_dir: str, decode_config,
           checkpoint: str = "final", precision: str = "float32", shortlist_size: int = 0,
           shortlist_per_source: int = 20, data_config=None, ensemble_weights=(),
           batching=None) -> str:
  """Exports the model of `model_dir` at `checkpoint` (see checkpoints.choose_checkpoint) as
  the next version of `export_dir`, with `decode_config`'s search fixed in it and
  `translate_nbest` returning the whole beam, its matrix products' weights in `precision`
  (see layers.precisions).

  With `shortlist_size` (>= 2 and below the target vocabulary's size; 0: none) every search
  writes only that many target pieces for each sentence, its own whatever its batch
  (tf_transformer/decoding/shortlist.py), chosen with the lexicon of `shortlist_per_source` target
  pieces per source piece that is counted here over the training data of DataConfig
  `data_config` (data_pipeline/lexical_shortlist.py).

  A list of model directories is exported as their ensemble (decoding/ensemble.py), with
  `ensemble_weights` (one each; default: equal): the SavedModel holds every member's weights
  and runs one search over them; its version is the next free number.

  With `batching` (config.BatchingConfig) the signatures of Translator.BATCHED_SIGNATURES merge
  concurrent requests in-graph, and their warm-up requests have each of its allowed batch
  sizes of rows (`_warmup_batches`), so that the merged searches are compiled at load.

  Returns:
    The version folder written, `export_dir`/<the checkpoint's step, or the next free number>.

  Raises:
    ModelDirError: the model directory, its vocabulary or its checkpoint is unusable.
    CorpusError: a shortlist's training data is missing.
  """
  members = {}
  if isinstance(model_dir, str):
    model, vocabulary, step = load_for_inference(model_dir, src_lang, tgt_lang, checkpoint)
  else:
    model, vocabulary, steps = load_ensemble_for_inference(model_dir, src_lang, tgt_lang,
                                                           checkpoint, ensemble_weights)
    members = {"ensemble": list(model_dir), "ensemble_weights": list(model.weights),
               "checkpoint_steps": steps}
    step = 0  # no one checkpoint's step: the next free version
  lexicon = None
  if shortlist_size >= vocabulary.target_size:
    logging.info("--shortlist_size=%d is not below the target vocabulary's %d pieces: the "
                 "search keeps the whole vocabulary", shortlist_size, vocabulary.target_size)
    shortlist_size = 0
  if shortlist_size:
    lexicon = lexical_shortlist.from_training_data(data_config, vocabulary, shortlist_per_source)
  decode_config = dataclasses.replace(decode_config, nbest=decode_config.beam_size)
  module = Translator(model, vocabulary, decode_config, precision=precision,
                      shortlist_size=shortlist_size, lexicon=lexicon, batching=batching)
  # the model's target languages, several for a multilingual model whatever --tgt_lang says
  trained_into = model_dir_lib.read_data(model_dir if isinstance(model_dir, str)
                                         else model_dir[0]).get("tgt_lang", tgt_lang)
  settings = {**dataclasses.asdict(decode_config), "checkpoint_step": step,
              "src_lang": src_lang, "tgt_lang": trained_into, "precision": precision,
              "shortlist_size": shortlist_size,
              "shortlist_per_source": shortlist_per_source if shortlist_size else 0,
              "batching": dataclasses.asdict(batching) if batching else None, **members}
  path = save_version(module, module.signatures(), export_dir, next_version(export_dir, step),
                      settings, batching)
  write_batching_parameters(export_dir, module.max_batch_size)
  return path
