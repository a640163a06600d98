"""The SavedModel's contract, declared once: each signature's name, the Translator method that
serves it, its inputs (dtype, shape, what bounds each) and outputs, whether concurrent requests
to it merge under in-graph batching, and what its warm-up requests send.

The export (Translator.signatures), the warm-up records (warmup.py), `load()`'s calls
(tf_transformer.inference), docs/serving.md's signature table (`markdown_table`, checked by a
test) and the hostile-request tests all read it from here.
"""

import dataclasses

import tensorflow as tf

# What a warm-up request sends to an input (warmup.py): the request's texts, the forced prefix
# of every warm-up, no constraint, or each row's index (the seeds)
TEXTS, PREFIX, NO_CONSTRAINT, ROW_INDEX = "texts", "prefix", "no constraint", "row index"

# A subword piece is at most 16 characters (SentencePiece's max_sentencepiece_length) of at most
# 4 bytes, with white space around it: the bytes of a text that its first pieces can come from.
BYTES_PER_PIECE = 128

_ROW_TEXT = (f"a row's first max_source_length pieces, read from its first {BYTES_PER_PIECE} "
             "bytes a piece")
_ROWS = "any number of rows, searched max_batch_size at a time"


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One input or output of a signature.

  Attributes:
    name: its key in a request or a response.
    dtype: tf.string, tf.int64, tf.float32, tf.int32 or tf.bool.
    shape: as documented, e.g. "[None]", "[None, beam]" (the first dimension: the rows).
    bound: what bounds an input whatever a client sends ("" for outputs).
    warmup: what a warm-up request sends to an input (TEXTS, PREFIX, NO_CONSTRAINT,
      ROW_INDEX).
    side: "source" or "target" for a text read as that side's subword pieces, cut at
      max_source_length of them (and reported in the output `cut`); "" for other inputs.
  """
  name: str
  dtype: tf.DType
  shape: str = "[None]"
  bound: str = ""
  warmup: str = TEXTS
  side: str = ""


@dataclasses.dataclass(frozen=True)
class Signature:
  """One signature of the SavedModel.

  Attributes:
    name: the signature's name.
    method: the Translator method (a tf.function over `inputs`, in their order) behind it.
    inputs, outputs: its Tensors; every input is [None], one value a row.
    note: what the outputs mean beyond their shapes (docs/serving.md's table).
    batched: concurrent requests merge into one search under in-graph batching. Not `align`:
      its outputs are as wide as the longest input of the batch, so a merged batch would widen
      a caller's.
    search: the search it runs ("beam", "constrained", "sample"; "" for `score`): signatures
      of one search run its XLA programs (a forced prefix of the narrowest bucket runs the
      program of none).
    compiles: (of the batched) the one of its search whose warm-ups run at every batch size
      (`compiling`): warming it warms every program the others of its search run.
  """
  name: str
  method: str
  inputs: tuple
  outputs: tuple
  note: str = ""
  batched: bool = True
  search: str = ""
  compiles: bool = False

  @property
  def input_names(self) -> tuple:
    return tuple(tensor.name for tensor in self.inputs)

  def input_specs(self) -> list:
    """tf.TensorSpecs of the inputs, named as in a request: the method's input_signature."""
    return [tf.TensorSpec([None], tensor.dtype, name=tensor.name) for tensor in self.inputs]


_INPUTS = Tensor("inputs", tf.string, bound=_ROW_TEXT, side="source")
_PREFIX = Tensor("prefix", tf.string, bound=_ROW_TEXT, warmup=PREFIX, side="target")
_CONSTRAINTS = Tensor("constraints", tf.string, warmup=NO_CONSTRAINT, bound=(
    "at most 2 x max_constraint_tokens phrases a row, each of at most "
    f"{BYTES_PER_PIECE} x max_constraint_tokens bytes (more is refused)"))
_SEED = Tensor("seed", tf.int64, bound="any int64", warmup=ROW_INDEX)
# Every signature's last output: whether a text of the row was cut (`_ROW_TEXT`), its answer
# then being that of the text's first pieces
CUT = Tensor("cut", tf.bool)
_BEST = (Tensor("outputs", tf.string), Tensor("scores", tf.float32), CUT)
_NBEST = (Tensor("outputs", tf.string, "[None, beam]"),
          Tensor("scores", tf.float32, "[None, beam]"), CUT)

SIGNATURES = (
    Signature("serving_default", "serve", (_INPUTS,), _BEST, "the best translation",
              search="beam", compiles=True),
    Signature("translate_nbest", "translate_nbest", (_INPUTS,), _NBEST,
              "the beam's outputs, best first", search="beam"),
    Signature("translate_prefix", "translate_prefix", (_INPUTS, _PREFIX), _NBEST,
              "each output begins with its prefix", search="beam"),
    Signature("translate_constrained", "translate_constrained", (_INPUTS, _CONSTRAINTS),
              _NBEST, "each output contains each tab-separated phrase of its `constraints` row "
              "and none written with a leading `!`", search="constrained", compiles=True),
    Signature("translate_constrained_prefix", "translate_constrained_prefix",
              (_INPUTS, _CONSTRAINTS, _PREFIX), _NBEST,
              "as `translate_constrained`, each output beginning with its prefix",
              search="constrained"),
    Signature("sample", "sample", (_INPUTS, _SEED), _BEST, "one random sample a row",
              search="sample", compiles=True),
    Signature("sample_prefix", "sample_prefix", (_INPUTS, _PREFIX, _SEED), _BEST,
              "as `sample`, each output beginning with its prefix", search="sample"),
    Signature("score", "score",
              (Tensor("source", tf.string, bound=_ROW_TEXT, side="source"),
               Tensor("target", tf.string, bound=_ROW_TEXT, side="target")),
              (Tensor("log_prob", tf.float32), CUT), "with the export's alpha"),
    Signature("align", "align", (_INPUTS,),
              (Tensor("outputs", tf.string), Tensor("source_tokens", tf.string, "[None, S]"),
               Tensor("target_tokens", tf.string, "[None, T]"),
               Tensor("attention", tf.float32, "[None, T, S]"), CUT),
              "the subword pieces read and written (`</s>` included, `\"\"` as padding) and "
              "the last decoder layer's attention between them", batched=False, search="beam"),
)

BY_NAME = {signature.name: signature for signature in SIGNATURES}
# The signature every export had before --signatures: its outputs' width is the beam of an
# (older) export without decoding.json
NBEST = "translate_nbest"
NAMES = tuple(BY_NAME)
BATCHED = tuple(signature.name for signature in SIGNATURES if signature.batched)
COMPILING = tuple(signature.name for signature in SIGNATURES if signature.compiles)


def compiling(names) -> tuple:
  """Of an export's signatures `names`, the batched ones whose warm-ups run at every allowed
  batch size: for each search, its signature of COMPILING, or without it the first of `names`
  that runs that search (an export of some signatures only)."""
  chosen = {}
  for signature in SIGNATURES:
    if signature.name in names and signature.batched and signature.search:
      if signature.search not in chosen or signature.compiles:
        chosen[signature.search] = signature.name
  return tuple(chosen.values())


def chosen(names) -> tuple:
  """The contract's names among `names` (an export's choice; empty: all), in the contract's
  order.

  Raises:
    ValueError: a name that is no signature of the contract, named with the valid ones.
  """
  unknown = [name for name in names if name not in BY_NAME]
  if unknown:
    raise ValueError(f"no signature {', '.join(unknown)} (the signatures: {', '.join(NAMES)})")
  return tuple(name for name in NAMES if name in names) if names else NAMES


def call(function, name: str, *args) -> dict:
  """A signature's function (a loaded SavedModel's, which takes keywords) called with
  positional `args` in the order of its inputs."""
  return function(**dict(zip(BY_NAME[name].input_names, args)))


_DTYPE_NAMES = {tf.string: "string", tf.int64: "int64", tf.float32: "float", tf.int32: "int32",
                tf.bool: "bool"}


def _described(tensors) -> str:
  """"`a`, `b`: string `[None]`, `c`: int64 `[None]`": runs of one dtype and shape joined."""
  runs = []
  for tensor in tensors:
    kind = f"{_DTYPE_NAMES[tensor.dtype]} `{tensor.shape}`"
    if runs and runs[-1][1] == kind:
      runs[-1][0].append(tensor.name)
    else:
      runs.append(([tensor.name], kind))
  return ", ".join(", ".join(f"`{name}`" for name in names) + f": {kind}"
                   for names, kind in runs)


def markdown_table() -> str:
  """docs/serving.md's tables, as the contract declares them: the signatures, then what bounds
  each input whatever a client sends."""
  lines = ["| signature | inputs | outputs |", "|---|---|---|"]
  for signature in SIGNATURES:
    lines.append(f"| `{signature.name}` | {_described(signature.inputs)} | "
                 f"{_described(signature.outputs)}: {signature.note} |")
  inputs = {tensor.name: tensor for signature in SIGNATURES for tensor in signature.inputs}
  lines += ["", "| input | bound |", "|---|---|", f"| (rows) | {_ROWS} |"]
  lines += [f"| `{tensor.name}` | {tensor.bound} |" for tensor in inputs.values()]
  lines += ["", f"Every signature's output `{CUT.name}` (bool `[None]`) is true for a row with a "
            "text cut at its bound (its source, prefix or target): the answer is that of the "
            "text's first pieces."]
  return "\n".join(lines)
