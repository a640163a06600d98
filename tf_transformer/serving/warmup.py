"""The warm-up requests of an export: written at export for every signature (as the contract
declares its inputs), and replayed as TF Serving replays them at load, with a guard on the
memory mappings that XLA's compiled programs take."""

import os

import tensorflow as tf
from absl import logging

from tf_transformer.model_dir import ModelDirError
from tf_transformer.serving import signatures

WARMUP_INPUTS = ("", "Hello.", "A man in a blue shirt is standing on a ladder cleaning windows.")
WARMUP_BATCH_SIZES = (1, 8)
# The forced prefix of every warm-up request: a few pieces, the narrowest prefix bucket
WARMUP_PREFIX = WARMUP_INPUTS[1]
# With in-graph batching, also a text of about 30 subword pieces (an 8k vocabulary of English),
# the width of most merged batches of sentences
WARMUP_LONG_INPUT = ("Two young, White males are outside near many bushes. Several men in hard "
                     "hats are operating a giant pulley system.")

def _warmup_log(signature_name: str, texts):
  """A PredictionLog of one request to `signature_name` giving each input what the contract
  says a warm-up sends it (signatures.Tensor.warmup): `texts`, WARMUP_PREFIX each (the forced
  prefixes), "" each (the constraints, see `_warmup_batches`) or the numbers 0, 1, ... (the
  seeds)."""
  from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

  request = predict_pb2.PredictRequest(
      model_spec=model_pb2.ModelSpec(signature_name=signature_name))
  for tensor in signatures.BY_NAME[signature_name].inputs:
    values = {signatures.TEXTS: texts, signatures.PREFIX: [WARMUP_PREFIX] * len(texts),
              signatures.NO_CONSTRAINT: [""] * len(texts),
              signatures.ROW_INDEX: list(range(len(texts)))}[tensor.warmup]
    request.inputs[tensor.name].CopyFrom(tf.make_tensor_proto(values, dtype=tensor.dtype))
  return prediction_log_pb2.PredictionLog(
      predict_log=prediction_log_pb2.PredictLog(request=request))


def _warmup_batches(names, batching,
                    buckets=None) -> list[tuple[str, list[str]]]:
  """(signature name, texts) of each warm-up request: WARMUP_BATCH_SIZES rows of the cycled
  WARMUP_INPUTS for each signature. With `batching` (config.BatchingConfig) instead, for each
  of signatures.compiling(names), each allowed batch size of rows, all one text, for one text
  of each source bucket among those of `buckets` ({text: Translator.source_bucket(text)}, one
  for each width of the export's ladder, xla_shapes.width_ladder): its merged searches run at
  those sizes, and a batch is padded to the ladder's width of its widest text, so every merge
  of texts is compiled at load; the other batched signatures, whose searches run those
  programs, one row each.

  The forced prefixes are WARMUP_PREFIX (`_warmup_log`), of the narrowest prefix bucket: the
  searches with a prefix then run the programs of those without one (a merged batch of longer
  prefixes compiles its width the first time, as a longer source does). The constraints are
  "": the narrow constrained search (xla_shapes.constraint_width); the wide one compiles at
  a batch size the first time a request of wider constraints runs there, not at load, where at
  base dims it would add a third to the programs and their memory mappings (docs/serving.md)."""
  requests, compiling = [], signatures.compiling(names)
  for name in names:
    if batching and name in compiling:
      widths = {}
      for text in sorted(buckets, key=lambda text: not text):  # non-empty texts first
        widths.setdefault(buckets[text], text)
      batches = [[text] * size for size in batching.allowed_batch_sizes
                 for text in widths.values()]
    elif batching and name in signatures.BATCHED:
      batches = [[WARMUP_PREFIX]]
    else:
      batches = [[WARMUP_INPUTS[i % len(WARMUP_INPUTS)] for i in range(batch)]
                 for batch in WARMUP_BATCH_SIZES]
    requests += [(name, texts) for texts in batches]
  return requests


def write_warmup_requests(version_dir: str, names, batching=None, buckets=None) -> str:
  """assets.extra/tf_serving_warmup_requests: PredictionLog records of the requests of
  `_warmup_batches` (a 1-row and an 8-row request to each signature without batching).

  TF Serving replays them at load, before it takes traffic, so the first real request to any
  signature does not pay for its tracing or for the XLA compilation of those batch buckets.

  Args:
    version_dir: the SavedModel folder.
    names: the signatures saved (`score` gets the texts as both source and target).
    batching: the export's config.BatchingConfig, or None.
    buckets: with `batching`, the candidate texts of the batched signatures' warm-ups and
      their source buckets, {text: Translator.source_bucket(text)}.

  Returns:
    The path of the records file.
  """
  path = tf.io.gfile.join(version_dir, "assets.extra", "tf_serving_warmup_requests")
  tf.io.gfile.makedirs(tf.io.gfile.join(version_dir, "assets.extra"))
  with tf.io.TFRecordWriter(path) as writer:
    for name, texts in _warmup_batches(names, batching, buckets):
      writer.write(_warmup_log(name, texts).SerializeToString())
  return path


def replay_warmup_requests(saved_model: str, loaded) -> int:
  """Runs a SavedModel's TF Serving warm-up requests (assets.extra/tf_serving_warmup_requests)
  as TF Serving does at load: an export with in-graph batching runs its merged searches at each
  allowed batch size, and each is compiled here, before the caller's first request.

  Returns:
    The number of requests run.

  Raises:
    ModelDirError: the XLA programs would exhaust the system's memory mappings (see
      `_memory_mapping_problem`), before they do: past the limit, XLA's compiler fails and the
      process dies with a segmentation fault.
  """
  from tensorflow_serving.apis import prediction_log_pb2

  path = os.path.join(saved_model, "assets.extra", "tf_serving_warmup_requests")
  requests = [prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
              for record in tf.data.TFRecordDataset(path)]
  rows = [_request_rows(request) for request in requests]
  names = [request.model_spec.signature_name for request in requests]
  # by batch size (stable): each larger size compiles about the programs of the smallest, so
  # the growth of the smallest's requests to the signatures that recur at the larger sizes
  # estimates the rest (the others' one request each mostly runs programs already compiled,
  # and counting them would underestimate; and searches share programs, so the first
  # requests alone would not be a fair sample either)
  order = sorted(range(len(requests)), key=rows.__getitem__)
  smallest = min(rows, default=0)
  recurring = {name for name, size in zip(names, rows) if size > smallest}
  limit, growths, sample = memory_mapping_limit(), [], []
  for index, i in enumerate(order):
    before = memory_mappings() if limit else 0
    per_request = sum(sample) / len(sample) if sample and rows[i] > smallest else None
    if per_request is not None and rows[order[index - 1]] == smallest:
      logging.info("%s: the warm-up requests of %d row(s) added %s memory mappings; the %d "
                   "larger ones are expected to add about %s (vm.max_map_count=%s leaves %s)",
                   saved_model, smallest, f"{sum(growths):,}", len(requests) - index,
                   f"{round(per_request * (len(requests) - index)):,}", f"{limit:,}",
                   f"{limit - before:,}")
    problem = _memory_mapping_problem(before, limit, growths, len(requests) - index,
                                      per_request)
    if problem:
      raise ModelDirError(f"{saved_model}: its {len(requests)} warm-up requests compile XLA "
                          f"programs that {problem}: raise it (sysctl -w "
                          "vm.max_map_count=1048576), or export with a smaller "
                          "{max_batch_size:name} or with {decode_jit}",
                          max_batch_size=None, decode_jit=False)
    loaded.signatures[names[i]](**{
        name: tf.constant(tf.make_ndarray(proto)) for name, proto in requests[i].inputs.items()})
    if limit:
      growths.append(memory_mappings() - before)
      if rows[i] == smallest and names[i] in recurring:
        sample.append(growths[-1])
  return len(requests)


def _request_rows(request) -> int:
  """The rows of a PredictRequest: its first input's first dimension."""
  shape = next(iter(request.inputs.values())).tensor_shape.dim
  return shape[0].size if shape else 1


def memory_mapping_limit() -> int | None:
  """The most memory mappings a process may hold (Linux's vm.max_map_count), or None where
  the system does not say."""
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read())
  except (OSError, ValueError):
    return None


def memory_mappings() -> int:
  """The memory mappings this process holds (0 where the system does not say)."""
  try:
    with open("/proc/self/maps") as f:
      return sum(1 for _ in f)
  except OSError:
    return 0


def _memory_mapping_problem(mappings: int, limit: int | None, growths: list[int],
                            remaining: int, per_request: float | None = None) -> str | None:
  """Why the next `remaining` warm-up requests would exceed `limit` memory mappings, or None.

  XLA's CPU compiler maps three memory regions (code, constants, data) for each kernel of a
  program and keeps them: about 520 a program for a search at base dims (6 layers), so that
  an export of base dims with batching (61 warm-up requests, most of them compiling a
  program) needs about half of Linux's default vm.max_map_count of 65,530 (docs/serving.md).
  Given `per_request`, the rest are refused once they need a quarter more than the room left;
  and any request is refused whose room is less than twice the largest growth seen.

  Args:
    mappings: the mappings held now; limit: memory_mapping_limit() (None: no check).
    growths: the mappings each request so far added (compiled programs add, cached ones not).
    remaining: the requests still to run, the next one included.
    per_request: the mappings each remaining request is expected to add, or None (not known
      yet: before the requests of a whole batch size have run).
  """
  if not limit:
    return None
  room = limit - mappings
  if not growths:
    return None if room > _FIRST_PROGRAM_MAPPINGS else (
        f"need more memory mappings than the {max(room, 0):,} that vm.max_map_count="
        f"{limit:,} leaves")
  needed = max(round(per_request * remaining) if per_request is not None else 0,
               2 * max(growths))
  if needed > 1.25 * room or room < 2 * max(growths):
    return (f"need about {needed:,} more memory mappings, and vm.max_map_count={limit:,} "
            f"leaves {max(room, 0):,}")
  return None


# Room demanded before the first request, when no growth is known yet: a base-size program's.
_FIRST_PROGRAM_MAPPINGS = 1000
