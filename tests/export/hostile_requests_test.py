"""docs/bad_input.md's hostile requests: what a careless or hostile client sends to each
signature of an export. Every request returns (a row per input row) or fails with an error, and
the process's memory stays bounded, whatever the size of a line, a target or a request."""

import json
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_transformer
from tests import testutil
from tf_transformer.serving import signatures

# the export's length limit (flags/tiny.cfg's --max_length) and rows decoded at a time
MAX_LENGTH = 32
MAX_BATCH_SIZE = 64
# how much a process's peak resident memory may rise over a table's second pass (the first
# compiles what the requests need), its buffers handed back when freed (seen: 0-3 MiB; a 1 MB
# line tokenized whole, without the cut at 128 bytes a piece, 69 MiB for serving_default and
# 233 MiB for score, whose target a 20,000-word row is)
MEMORY_BOUND = 64 * 2**20

# Each signature's table: row name -> (arguments of the call, as Python source, and False if
# the call must return, else the message its InvalidArgumentError must hold). A text over the limit is cut to MAX_LENGTH pieces, so it must return.
# Every signature of the contract also gets the rows of `_contract_rows` (below).
_LONG = {
    "invalid UTF-8": "[b'\\xc3\\x28 aa', b'\\xff\\xfe bb']",
    "NUL and control bytes": "[b'aa\\x00bb\\x07\\x1b[31m cc']",
    "only white space": "[b' \\t  ', b'']",
    "a 1 MB line, one word": "[b'x' * 2**20]",
    "a 1 MB line of words": "[b'aa ' * 350_000]",
    # (10,000 rows of each signature: saved_model_test's large requests)
    "1,000 short rows": "[b'aa bb'] * 1000",
    "rows x length at the limit (129 rows of 1,000 words)":
        f"[b'aa bb cc dd ' * 250] * {2 * MAX_BATCH_SIZE + 1}",
    "no row": "[]",
}
TABLES = {
    **{signature: {name: (f"inputs={rows}", False) for name, rows in _LONG.items()}
       for signature in ("serving_default", "translate_nbest", "align")},
    "translate_prefix": {
        **{name: (f"inputs={rows}, prefix={rows}", False) for name, rows in _LONG.items()},
        "a 5,000-word prefix": ("inputs=[b'aa'], prefix=[b'bb ' * 5000]", False),
        "row counts differ": ("inputs=[b'aa', b'bb'], prefix=[b'cc']",
                              "translate_prefix: inputs and prefix must have the same number of rows"),
    },
    "score": {
        **{name: (f"source={rows}, target={rows}", False) for name, rows in _LONG.items()},
        "a 5,000-word target": ("source=[b'aa'], target=[b'bb ' * 5000]", False),
        "a 20,000-word target": ("source=[b'aa'], target=[b'bb cc ' * 10_000]", False),
        "1,000 rows of 1,000-word targets": ("source=[b'aa'] * 1000, target=[b'bb ' * 1000] * 1000",
                                             False),
        "row counts differ": ("source=[b'aa', b'bb'], target=[b'cc']",
                              "score: source and target must have the same number of rows"),
    },
    "translate_constrained": {
        **{name: (f"inputs={rows}, constraints=[b''] * len({rows})", False)
           for name, rows in _LONG.items()},
        **{name: (f"inputs={rows}, constraints=[b'aa'] * len({rows})", False)
           for name, rows in (("1,000 rows each with a phrase", "[b'aa bb'] * 1000"),)},
        "invalid UTF-8, NUL and control bytes in phrases to avoid": (
            "inputs=[b'aa', b'bb'], constraints=[b'!\\xc3\\x28', b'!a\\x00b\\x07']", False),
        "a phrase to include that the vocabulary cannot write": (
            "inputs=[b'aa'], constraints=[b'\\xc3\\x28']",
            "constraints: a phrase to include with a character the target vocabulary lacks in "
            "row] [0]"),
        "a 1 MB phrase": ("inputs=[b'aa'], constraints=[b'x' * 2**20]",
                          "constraints: a phrase of more than 4096 bytes in row] [0]"),
        "a 1 MB line of phrases": ("inputs=[b'aa'], constraints=[b'aa\\t' * 350_000]",
                                   "constraints: more than 64 phrases in row] [0]"),
        "only tabs": ("inputs=[b'aa'], constraints=[b'\\t\\t']",
                      "constraints: an empty phrase in row] [0]"),
        "row counts differ": ("inputs=[b'aa', b'bb'], constraints=[b'cc']",
                              "translate_constrained: inputs and constraints must have the same number of rows"),
    },
    "sample": {
        **{name: (f"inputs={rows}, seed=list(range(len({rows})))", False)
           for name, rows in _LONG.items()},
        "seeds at the int64 limits": ("inputs=[b'aa'] * 3, seed=[-2**63, -1, 2**63 - 1]", False),
        "row counts differ": ("inputs=[b'aa', b'bb'], seed=[1]",
                              "sample: inputs and seed must have the same number of rows"),
    },
    "sample_prefix": {
        **{name: (f"inputs={rows}, prefix={rows}, seed=list(range(len({rows})))", False)
           for name, rows in _LONG.items()},
        "a 5,000-word prefix": ("inputs=[b'aa'], prefix=[b'bb ' * 5000], seed=[1]", False),
        "row counts differ": ("inputs=[b'aa', b'bb'], prefix=[b'cc', b'dd'], seed=[1]",
                              "sample_prefix: inputs and seed must have the same number of rows"),
    },
    "translate_constrained_prefix": {
        **{name: (f"inputs={rows}, constraints=[b''] * len({rows}), prefix={rows}", False)
           for name, rows in _LONG.items()},
        "a 5,000-word prefix and a phrase": (
            "inputs=[b'aa'], constraints=[b'aa'], prefix=[b'bb ' * 5000]", False),
        "a 5,000-word prefix, no phrase": (
            "inputs=[b'aa'], constraints=[b''], prefix=[b'bb ' * 5000]", False),
        "a 1 MB phrase": ("inputs=[b'aa'], constraints=[b'x' * 2**20], prefix=[b'']",
                          "constraints: a phrase of more than 4096 bytes in row] [0]"),
    },
}


def _contract_rows(signature) -> dict:
  """The rows every signature of the contract (tf_transformer/serving/signatures.py) gets: each
  input as a scalar and as a matrix, and each input after the first with another row count;
  each must fail with the message docs/bad_input.md gives."""
  first = signature.inputs[0].name
  def call(**changed):
    values = {tensor.name: "[b'aa bb']" if tensor.dtype == tf.string else "[1]"
              for tensor in signature.inputs}
    return ", ".join(f"{name}={changed.get(name, value)}" for name, value in values.items())

  rows = {}
  for tensor in signature.inputs:
    one = "b'aa'" if tensor.dtype == tf.string else "1"
    rows[f"a scalar {tensor.name}"] = (
        call(**{tensor.name: one}),
        f"Shape of tensor {tensor.name} [] is not compatible with expected shape [?]")
    rows[f"a matrix {tensor.name}"] = (
        call(**{tensor.name: f"[[{one}], [{one}]]"}),
        f"Shape of tensor {tensor.name} [2,1] is not compatible with expected shape [?]")
  for tensor in signature.inputs[1:]:
    two = "[b'aa', b'bb']" if tensor.dtype == tf.string else "[1, 2]"
    rows[f"another row count of {tensor.name}"] = (
        call(**{tensor.name: two}),
        f"{signature.name}: {first} and {tensor.name} must have the same number of rows")
  return rows


for _signature in signatures.SIGNATURES:
  TABLES.setdefault(_signature.name, {}).update(_contract_rows(_signature))

# every table in one process of its own, as TF Serving holds a model: nothing but tensorflow
# and tensorflow_text loaded; each signature warmed up with a request of MAX_BATCH_SIZE rows
_CHILD = """
import ctypes, json, os, sys
# a large buffer handed back to the system when it is freed, so that the second pass of a
# table (below) allocates it anew: TensorFlow's default CPU allocator (the tools' BFC allocator
# keeps buffers for the next request) over malloc with a fixed mmap threshold (glibc's own
# rises with the buffers freed, and keeps them)
os.environ.pop("TF_CPU_ALLOCATOR_USE_BFC", None)
ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the SentencePiece ops)
%s
signatures = tf.saved_model.load(sys.argv[1]).signatures
tables = json.loads(sys.argv[2])

def tensors(signature, **named):
  specs = signatures[signature].structured_input_signature[1]
  return {key: tf.constant(value, specs[key].dtype) for key, value in named.items()}

for name in tables:
  rows = [b"aa bb cc"] * %d
  specs = signatures[name].structured_input_signature[1]
  signatures[name](**tensors(name, **{key: rows if spec.dtype == tf.string else
                                      list(range(len(rows))) for key, spec in specs.items()}))
def run_table(signature, table):
  outcomes = {}
  for name, (arguments, _) in table.items():
    try:
      inputs = eval("dict(" + arguments + ")")
      result = {key: value.numpy()
                for key, value in signatures[signature](**tensors(signature, **inputs)).items()}
      rows = len(next(iter(inputs.values())))
      whole = all(value.shape[0] == rows for value in result.values())
      finite = all(bool(tf.reduce_all(tf.math.is_finite(value))) for value in result.values()
                   if value.dtype.kind == "f")
      outcomes[name] = "returned" if whole and finite else f"bad result {result}"
    except (tf.errors.OpError, ValueError, TypeError) as error:
      message = (error.message if isinstance(error, tf.errors.OpError) else str(error)).strip()
      outcomes[name] = f"error: {type(error).__name__}: {message[-2000:]}"
  return outcomes

report = {}
for signature, table in tables.items():
  # the first pass compiles what its requests need (an XLA export's programs of new shapes);
  # the second, measured, shows what a request itself costs
  first = run_table(signature, table)
  outcomes, growth = peak_memory_growth(lambda: run_table(signature, table))
  report[signature] = {"outcomes": outcomes, "growth": growth, "same": outcomes == first}
print(json.dumps(report))
""" % (testutil.PEAK_MEMORY_SOURCE, MAX_BATCH_SIZE)


@pytest.fixture(scope="module", params=["unbatched_graph", "batching_xla"])
def export_version(request, tiny_model_dir, tmp_path_factory):
  """The tiny random model exported (beam 2) two ways: a graph search without batching, and
  the export's default, XLA-compiled searches, with in-graph batching (--batching): its
  version folder."""
  export_dir = tmp_path_factory.mktemp("hostile") / "tiny"
  way = (["--nodecode_jit"] if request.param == "unbatched_graph"
         else ["--decode_jit", "--batching"])
  result = testutil.run_cli("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg",
                            f"--model_dir={tiny_model_dir}", f"--export_dir={export_dir}",
                            "--beam_size=2", "--extra_decode_length=5", *way)
  assert result.returncode == 0, result.stderr
  return export_dir / "1"


@pytest.fixture(scope="module")
def report(export_version):
  """{signature: {"outcomes": {row: "returned" or "error: <type>"}, "growth": bytes}}."""
  tables = {signature: {name: [arguments, fails] for name, (arguments, fails) in table.items()}
            for signature, table in TABLES.items()}
  result = testutil.run_python(_CHILD, str(export_version), json.dumps(tables), fresh=True,
                               timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("signature", TABLES)
def test_every_hostile_request_returns_or_fails_in_bounded_memory(report, signature):
  outcomes = report[signature]["outcomes"]
  assert sorted(outcomes) == sorted(TABLES[signature]) and report[signature]["same"]
  wrong = {name: outcomes[name] for name, (_, message) in TABLES[signature].items()
           if not (outcomes[name] == "returned" if not message else
                   outcomes[name].startswith("error: InvalidArgumentError: ")
                   and message in outcomes[name])}
  assert not wrong, wrong
  growth = report[signature]["growth"]
  print(f"{signature}: peak resident memory grew {growth / 2**20:.0f} MiB")
  assert growth < MEMORY_BOUND


def test_a_target_over_the_limit_scores_as_its_first_pieces_and_says_so(tiny_model_dir):
  """load().score (and so translate --score) cuts the target at max_length pieces, as the
  source: a 5,000-word target scores as its first MAX_LENGTH pieces, and the call warns with
  an InputCutWarning naming that pair alone."""
  model = tf_transformer.load(str(tiny_model_dir), beam_size=2, max_source_length=MAX_LENGTH)
  words = ["aa", "bb", "cc"] * 2000
  pieces = model.count_tokens([" ".join(words[:MAX_LENGTH])], "target")[0] - 1
  assert pieces == MAX_LENGTH  # one piece a word: the cut text is the first 32 words
  with pytest.warns(tf_transformer.InputCutWarning) as warned:
    long, cut, shorter = model.score(["aa bb"] * 3, [" ".join(words),
                                                     " ".join(words[:MAX_LENGTH]),
                                                     " ".join(words[:MAX_LENGTH - 1])])
  assert [w.message.sentences for w in warned] == [[0]]
  assert str(warned[0].message) == (f"sentence 1 was cut at max_source_length={MAX_LENGTH} "
                                    "subword pieces: the answer is that of the first pieces")
  assert np.isfinite(long) and long == pytest.approx(cut, abs=1e-5)
  assert shorter != pytest.approx(cut, abs=1e-5)


def test_translate_warns_of_the_sentences_it_cut_numbered_from_first_index(tiny_model_dir):
  model = tf_transformer.load(str(tiny_model_dir), beam_size=2, max_source_length=MAX_LENGTH,
                              extra_decode_length=2)
  long = " ".join(["aa", "bb"] * MAX_LENGTH)
  for call, per in (({}, "translate"), ({"strategy": "sample", "nbest": 3}, "samples"),
                    ({"target_prefix": ["", long, ""]}, "prefix")):
    sources = ["aa", long, "bb"] if per != "prefix" else ["aa", "bb", "cc"]
    with pytest.warns(tf_transformer.InputCutWarning) as warned:
      model.translate(sources, first_index=10, **call)
    assert [w.message.sentences for w in warned] == [[11]], per
  with pytest.warns(tf_transformer.InputCutWarning) as warned:
    model.align([long, "aa", long])
  assert [w.message.sentences for w in warned] == [[0, 2]]
  with pytest.warns(tf_transformer.InputCutWarning) as warned:  # the call's own bound
    model.translate(["aa bb cc dd", "aa bb"], max_source_length=3)
  assert str(warned[0].message).startswith("sentence 1 was cut at max_source_length=3 ")
  with warnings.catch_warnings():
    warnings.simplefilter("error", tf_transformer.InputCutWarning)
    model.translate(["aa bb"])  # nothing cut: no warning
    with pytest.raises(tf_transformer.InputCutWarning):
      model.translate([long])
