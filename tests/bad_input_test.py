"""docs/bad_input.md's table, row by row: each bad input gives exit code 1 and one line
naming the flag, file, line or input, no traceback, and no partial output file."""

import concurrent.futures
import json
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from common.files import TEMPORARY_MARK
from tests import forked, testutil
from tests.tf_transformer.bin.train_test import write_corpus

TRAIN = ("tf_transformer.train", "--flagfile=flags/tiny.cfg", "--src_lang=src", "--tgt_lang=tgt",
         "--dev_prefix=", "--train_steps=2")
EXPORT = ("tf_transformer.bin.export_saved_model", "--flagfile=flags/tiny.cfg")
TRANSLATE = ("tf_transformer.bin.translate", "--flagfile=flags/tiny.cfg", "--beam_size=2",
             "--extra_decode_length=4")


class Case:
  """A bad input: the command (module and flags), stdin, and the last line it must print.
  `{d}` in them is the test's folder (a Multi30k-like corpus train.src/train.tgt is in it),
  `{m}` a copy of a trained model directory."""

  def __init__(self, command, message, stdin=None, prepare=None, file_limit=None):
    self.command, self.message, self.stdin = command, message, stdin
    self.prepare, self.file_limit = prepare, file_limit


def train(*flags, message, **kwargs):
  return Case((*TRAIN, "--data_dir={d}", "--model_dir={d}/model", *flags), message, **kwargs)


def translate(*flags, message, **kwargs):
  return Case((*TRANSLATE, "--model_dir={m}", *flags), message, **kwargs)


def export(*flags, message, **kwargs):
  return Case((*EXPORT, "--model_dir={m}", "--export_dir={d}/export", *flags), message, **kwargs)


MARIAN = testutil.ROOT / "tests" / "fixtures" / "marian" / "tiny"


def import_marian(change, message):
  """import_marian of a copy of the Marian fixture in {d}/marian that `change(folder)` breaks,
  into {d}/imported."""
  def prepare(d, m):
    shutil.copytree(MARIAN, d / "marian")
    change(d / "marian")
  return Case(("tf_transformer.bin.import_marian", "--from={d}/marian",
               "--model_dir={d}/imported"), message, prepare=prepare)


def _edit_json(name, **fields):
  """A change that sets `fields` in the JSON file `name` (None: removes the field)."""
  def change(folder):
    value = json.loads((folder / name).read_text())
    value.update(fields)
    for key in [key for key, field in fields.items() if field is None]:
      del value[key]
    (folder / name).write_text(json.dumps(value))
  return change


def _edit_weights(change):
  """A change of model.safetensors' tensors (a dict of NumPy arrays, changed in place)."""
  def edit(folder):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))
  return edit


def write(name, content):
  """A `prepare` step that writes `content` (bytes) to {d}/name."""
  return lambda d, m: (d / name).write_bytes(content)


def chain(*steps):
  return lambda d, m: [step(d, m) for step in steps]


ROWS = {
    # ------------------------------------------------------------------ corpus files
    "line counts differ": train(
        prepare=write("train.tgt", b"x\n"),
        message="error: {d}/train.src has 200 lines but {d}/train.tgt has 1; parallel files "
                "must be line-aligned"),
    "not UTF-8": train(
        prepare=write("train.src", b"ok\n\xff\xfe bad\n" * 100),
        message="error: {d}/train.src:2: not valid UTF-8 (byte 0xff at column 1); fix the file "
                "or pass --on_bad_line=skip"),
    "corpus file missing": train(
        "--train_prefix=nope",
        message="error: {d}/nope.src: no such file (nor {d}/nope.src.gz); check --data_dir and "
                "the prefixes"),
    "corpus files empty": train(
        prepare=chain(write("train.src", b""), write("train.tgt", b"")),
        message="error: {d}/train.src: file is empty"),
    "only empty lines": train(
        prepare=chain(write("train.src", b"\n\n"), write("train.tgt", b"\n\n")),
        message="error: {d}/train.src: no pair left for training (all empty, invalid or over "
                "--max_length=32)"),
    "every sentence over --max_length": train(
        "--max_length=1",
        message="error: {d}/train.src: no pair left for training (all empty, invalid or over "
                "--max_length=1)"),
    **{f"--train_weights={weights}": train(
        "--train_prefix=train,train", f"--train_weights={weights}",
        message="error: --train_weights must be a finite number >= 0 for each of the 2 --train_prefix "
                f"corpora, not all 0, got '{weights}'")
       for weights in ("1", "1,-1", "0,0", "1,x")},
    "a weighted corpus without a usable pair": train(
        "--train_prefix=train,extra", "--train_weights=1,1",
        prepare=chain(write("extra.src", b"\n\n"), write("extra.tgt", b"\n\n")),
        message="error: {d}/extra.src: no usable pair, but its --train_weights is 1"),
    "--subword_alpha with one segmentation to sample from": train(
        "--subword_alpha=0.1", "--subword_nbest_size=1",
        message="error: DataConfig: subword_nbest_size=1 leaves one segmentation to sample from: "
                "-1 (all) or >= 2 with subword_alpha > 0"),
    "--subword_alpha with --deterministic": train(
        "--subword_alpha=0.1", "--deterministic",
        message="error: --deterministic cannot hold with --subword_alpha: SentencePiece samples "
                "with its own random generator, which TensorFlow cannot seed"),
    "several target languages, one twice": train(
        "--tgt_lang=tgt,tgt",
        message="error: DataConfig: tgt_lang='tgt,tgt': several target languages must be "
                "distinct, non-empty, comma-separated languages"),
    # ------------------------------------------------------------------ flags and flagfiles
    "unknown flag": train(
        "--batch_tokes=100",
        message="error: Unknown command line flag 'batch_tokes'. Did you mean: batch_tokens ? "
                "(see --helpfull)"),
    "missing flagfile": Case(
        ("tf_transformer.train", "--flagfile={d}/nope.cfg"),
        message="error: Unable to open flagfile: [Errno 2] No such file or directory: "
                "'{d}/nope.cfg' (see --helpfull)"),
    "flagfile line that is not a flag": Case(
        ("tf_transformer.train", "--flagfile={d}/my.cfg"),
        prepare=write("my.cfg", b"--flagfile=flags/tiny.cfg\nbeam_size=5\n"),
        message="error: {d}/my.cfg:2: 'beam_size=5' is not a flag (write --name=value) "
                "(see --helpfull)"),
    "value of the wrong type": train(
        "--train_steps=ten",
        message="error: flag --train_steps=ten: invalid literal for int() with base 10: 'ten' "
                "(see --helpfull)"),
    "stray argument": train(
        "extra",
        message="error: unexpected arguments: extra (flags are --name=value)"),
    **{f"--{name}={value}": train(
        f"--{name}={value}",
        message=f"error: flag --{name}={value}: {value} is not a positive integer "
                "(see --helpfull)")
       for name, value in [("batch_tokens", 0), ("train_steps", 0), ("eval_every", -1),
                           ("save_every", 0), ("max_length", 0), ("update_freq", 0)]},
    **{f"--{name}={value}": train(
        f"--{name}={value}",
        message=f"error: flag --{name}={value}: must be {domain} (see --helpfull)")
       for name, value, domain in [
           ("learning_rate", -1.0, "a finite number > 0"),
           ("learning_rate", 0.0, "a finite number > 0"),
           ("learning_rate", "nan", "a finite number > 0"),
           ("clip_norm", -1.0, "a finite number >= 0 (0: off)"),
           ("label_smoothing", 1.0, "in [0, 1)"),
           ("dropout_rate", 1.0, "in [0, 1)"),
           ("attention_dropout_rate", -0.1, "in [0, 1)"),
           ("relu_dropout_rate", 1.5, "in [0, 1)"),
           ("ema_decay", 1.0, "in [0, 1) (0: no moving average)")]},
    "--average_last=-1": train(
        "--average_last=-1",
        message="error: flag --average_last=-1: -1 is not a non-negative integer "
                "(see --helpfull)"),
    "--warmup_steps=0": train(
        "--warmup_steps=0",
        message="error: flag --warmup_steps=0: 0 is not a positive integer (see --helpfull)"),
    "--seed=-1": train(
        "--seed=-1",
        message="error: flag --seed=-1: -1 is not an integer in the range [0, 4294967295] "
                "(see --helpfull)"),
    "translate --alpha=-0.5": translate(
        "--alpha=-0.5",
        message="error: flag --alpha=-0.5: must be a finite number >= 0 (see --helpfull)"),
    "--vocab_size=0": train(
        "--vocab_size=0",
        message="error: flag --vocab_size=0: 0 is not integer >= 16 "
                "(see --helpfull)"),
    **{f"translate --{name}={value}": translate(
        f"--{name}={value}",
        message=f"error: flag --{name}={value}: {value} is not a positive integer "
                "(see --helpfull)")
       for name, value in [("batch_size", 0), ("batch_size", -1), ("beam_size", 0)]},
    "--nbest over --beam_size": translate(
        "--nbest=3",
        message="error: --nbest must be between 1 and --beam_size (2), got 3"),
    "--ensemble of one model directory": translate(
        "--ensemble={m}",
        message="error: --ensemble needs two or more model directories, got 1"),
    "--ensemble_weights unlike --ensemble": translate(
        "--ensemble={m},{m}", "--ensemble_weights=1",
        message="error: --ensemble_weights must be a number > 0 for each of the 2 --ensemble "
                "directories, got '1'"),
    "--ensemble with --saved_model": Case(
        ("tf_transformer.bin.translate", "--flagfile=flags/tiny.cfg", "--ensemble={m},{m}",
         "--saved_model={m}"),
        message="error: give --ensemble (model directories) or --saved_model, not both"),
    "an ensemble to CTranslate2": Case(
        ("tf_transformer.bin.export_ctranslate2", "--flagfile=flags/tiny.cfg", "--ensemble={m},{m}",
         "--output_dir={d}/ct2"),
        message="error: the CTranslate2 format has no ensembles (CTranslate2 declined them): "
                "export one model with --model_dir, or the ensemble with export_saved_model "
                "--ensemble"),
    "a sampling flag without --strategy=sample": translate(
        "--sampling_temperature=1.5",
        message="error: --sampling_temperature=1.5 needs --strategy=sample (--strategy=beam "
                "does not sample)"),
    "sampling flags to evaluate without --strategy=sample": Case(
        ("tf_transformer.bin.evaluate", "--flagfile=flags/tiny.cfg", "--model_dir={m}",
         "--src={d}/train.src", "--ref={d}/train.tgt", "--sampling_topk=5",
         "--sampling_topp=0.9"),
        message="error: --sampling_topk=5 and --sampling_topp=0.9 need --strategy=sample "
                "(--strategy=beam does not sample)"),
    "--sampling_topp=0": translate(
        "--strategy=sample", "--sampling_topp=0",
        message="error: flag --sampling_topp=0.0: must be in (0, 1] (see --helpfull)"),
    "--saved_model with --model_dir": Case(
        ("tf_transformer.bin.translate", "--flagfile=flags/tiny.cfg", "--model_dir={m}",
         "--saved_model={m}"),
        message="error: give exactly one of --saved_model and --model_dir"),
    # ------------------------------------------------------------------ model directories
    "model dir missing": translate(
        "--model_dir={d}/nope",
        message="error: {d}/nope: no such directory"),
    "model dir empty": translate(
        "--model_dir={d}",
        message="error: {d}/config.json: no such file; is {d} a trained model directory?"),
    "model dir is a file": translate(
        "--model_dir={d}/train.src",
        message="error: {d}/train.src: not a directory (--model_dir names a folder)"),
    "train into a file": train(
        "--model_dir={d}/train.src",
        message="error: {d}/train.src: not a directory (--model_dir names a folder)"),
    "truncated .index": translate(
        prepare=lambda d, m: (m / "ckpt-1.index").write_bytes(b"\0" * 10),
        message="error: {m}/ckpt-1: cannot restore this checkpoint (...); delete it to resume from "
                "an earlier one, or use another --model_dir"),
    "corrupt checkpoint state file": translate(
        prepare=lambda d, m: (m / "checkpoint").write_bytes(b"model_checkpoint_path: 1 2 {"),
        message="error: {m}/checkpoint: names no readable checkpoint (a corrupt file, or its "
                "checkpoints are gone); delete it and the checkpoints it named, or use another "
                "--model_dir"),
    "corrupt best/": translate(
        prepare=lambda d, m: (shutil.copytree(m, m / "best", ignore=lambda *_: ["spm.joint.model",
                                                                                "config.json"]),
                              [p.write_bytes(b"\0") for p in (m / "best").glob("ckpt-1.data*")]),
        message="error: {m}/best/ckpt-1: cannot restore this checkpoint (...); delete it to resume "
                "from an earlier one, or use another --model_dir"),
    "corrupt config.json": translate(
        prepare=lambda d, m: (m / "config.json").write_text('{"d_model": '),
        message="error: {m}/config.json: unreadable (...); use another --model_dir"),
    "foreign config.json": translate(
        prepare=lambda d, m: (m / "config.json").write_text('{"hidden_size": 512}'),
        message="error: {m}/config.json: not this project's model config (...); use another "
                "--model_dir"),
    "model dir not writable": train(
        "--model_dir={d}/train.src/model",
        message="error: {d}/train.src/model: Not a directory"),
    "disk full": train(
        "--save_every=1", file_limit=600_000,
        message="error: ...File too large..."),
    # ------------------------------------------------------------------ translate inputs
    "non-UTF-8 stdin": translate(
        stdin=b"fine\n\xc3\x28 broken\n",
        message="error: <stdin>:2: not valid UTF-8"),
    "unwritable --output": translate(
        "--input={d}/train.src", "--output={d}/train.src/out.txt",
        message="error: {d}/train.src/out.txt: Not a directory"),
    "--constraints with an empty phrase": translate(
        "--constraints={d}/terms.txt", stdin=b"aa\nbb\n",
        prepare=write("terms.txt", b"\ncc\t\tdd\n"),
        message="error: {d}/terms.txt:2: '' is not a phrase (empty, or with a tab or line "
                "break)"),
    "--constraints longer than the output": translate(
        "--constraints={d}/terms.txt", stdin=b"aa\n",
        prepare=write("terms.txt", b"bb cc dd ee ff gg hh ii jj kk\n"),
        message="error: {d}/terms.txt:1: more subword pieces to include (with the prefix and "
                "the end of the sentence) than the length limit of the output"),
    "--constraints not line-aligned": translate(
        "--constraints={d}/terms.txt", stdin=b"aa\nbb\n", prepare=write("terms.txt", b"cc\n"),
        message="error: {d}/terms.txt has 1 lines but <stdin> has 2; they must be line-aligned"),
    "--constraints with --strategy=sample": translate(
        "--constraints={d}/terms.txt", "--strategy=sample", stdin=b"aa\n",
        prepare=write("terms.txt", b"cc\n"),
        message="error: lexical constraints need a beam search, not --strategy=sample"),
    # ------------------------------------------------------------------ export
    **{f"export --{name}={value}": export(
        f"--{name}={value}", message=f"error: flag --{name}={value}: {reason} (see --helpfull)")
       for name, value, reason in [
           ("shortlist_size", -1, "must be 0 (no shortlist) or an integer >= 2"),
           ("shortlist_size", 1, "must be 0 (no shortlist) or an integer >= 2"),
           ("shortlist_per_source", 0, "0 is not a positive integer")]},
    "export a shortlist without data flags": export(
        "--shortlist_size=8",
        message="error: --data_dir is required (the folder of the corpus files), or "
                "--dataset=tfds:NAME"),
    "export a shortlist without its training data": export(
        "--shortlist_size=8", "--data_dir={d}/nope", "--src_lang=src", "--tgt_lang=tgt",
        message="error: {d}/nope/train.src: no such file (nor {d}/nope/train.src.gz); check "
                "--data_dir and the prefixes"),
    "export --batching_allowed_sizes out of order": export(
        "--batching", "--batching_allowed_sizes=4,2,32",
        message="error: --batching_allowed_sizes=4,2,32 must be increasing positive integers "
                "ending with --batching_max_size=32"),
    "export --batching_allowed_sizes not ending with the largest": export(
        "--batching", "--batching_allowed_sizes=1,2,16",
        message="error: --batching_allowed_sizes=1,2,16 must be increasing positive integers "
                "ending with --batching_max_size=32"),
    "export --batching_allowed_sizes not numbers": export(
        "--batching", "--batching_allowed_sizes=a",
        message="error: --batching_allowed_sizes=a must be integers"),
    "export --batching_max_size=0": export(
        "--batching", "--batching_max_size=0",
        message="error: flag --batching_max_size=0: 0 is not a positive integer (see --helpfull)"),
    "export a batching setting without --batching": export(
        "--batching_timeout_micros=500",
        message="error: --batching_timeout_micros needs --batching"),
    "evaluate with a missing reference": Case(
        ("tf_transformer.bin.evaluate", "--flagfile=flags/tiny.cfg", "--model_dir={m}",
         "--src={d}/train.src", "--ref={d}/nope.tgt"),
        message="error: {d}/nope.tgt: no such file"),
    "a vocabulary smaller than its characters": train(
        "--spm_byte_fallback",  # tiny.cfg's 64 pieces: fewer than the 256 bytes alone
        message="error: --vocab_size=64 is too small for {d}/model/spm.joint.model: "
                "SentencePiece keeps 272 pieces whole (the text's characters, the special "
                "pieces, the 256 bytes of --spm_byte_fallback); give --vocab_size=272 or more"),
    "--update_vocab without --init_from": train(
        "--update_vocab",
        message="error: --update_vocab needs --init_from (the model whose weights the new "
                "vocabulary takes over)"),
    # ------------------------------------------------------------------ import_marian
    "not a Marian model": import_marian(
        _edit_json("config.json", model_type="bart"),
        message="error: {d}/marian/config.json: model_type 'bart' is not 'marian'"),
    "a Marian model of pre-norm layers": import_marian(
        _edit_json("config.json", normalize_before=True),
        message="error: {d}/marian/config.json: an architecture this project cannot hold: "
                "normalize_before=true (pre-norm layers)"),
    "a Marian folder without source.spm": import_marian(
        lambda folder: (folder / "source.spm").unlink(),
        message="error: {d}/marian/source.spm: no such file (a Marian model folder holds "
                "config.json, model.safetensors, source.spm, target.spm, vocab.json)"),
    "a Marian folder without vocab.json": import_marian(
        lambda folder: (folder / "vocab.json").unlink(),
        message="error: {d}/marian/vocab.json: no such file (a Marian model folder holds "
                "config.json, model.safetensors, source.spm, target.spm, vocab.json)"),
    "a Marian vocabulary of another size than the config's": import_marian(
        _edit_json("vocab.json", **{"<unk>": None}),
        message="error: {d}/marian/vocab.json: 201 pieces, not config.json's vocab_size 202 "
                "(or ids that are not 0..201)"),
    "Marian weights of another vocabulary size": import_marian(
        _edit_weights(lambda tensors: tensors.update(
            {"model.shared.weight": tensors["model.shared.weight"][:-1]})),
        message="error: {d}/marian/model.safetensors: model.shared.weight has shape [201, 32], "
                "not [202, 32]"),
    "a tensor missing from the Marian weights": import_marian(
        _edit_weights(lambda tensors: tensors.pop("model.decoder.layers.1.fc2.bias")),
        message="error: {d}/marian/model.safetensors: no tensor model.decoder.layers.1.fc2.bias"),
    "Marian weights in pytorch_model.bin only": import_marian(
        lambda folder: (folder / "model.safetensors").rename(folder / "pytorch_model.bin"),
        message="error: {d}/marian: holds pytorch_model.bin only; convert it to "
                "model.safetensors first, e.g. with transformers: "
                "MarianMTModel.from_pretrained(folder).save_pretrained(folder, "
                "safe_serialization=True)"),
}


# rows run in a real `python`, start-up included (none with a file limit); the others in a
# process forked with TensorFlow loaded (tests/forked.py)
FRESH = {"line counts differ", "unknown flag", "model dir missing", "non-UTF-8 stdin"}


def _matches(line: str, pattern: str) -> bool:
  """`line` is `pattern`, "..." in it standing for any text."""
  return re.fullmatch(".*".join(map(re.escape, pattern.split("..."))), line) is not None


def _run(name, corpus, model_dir, folder):
  """Runs row `name` in `folder`; returns (CompletedProcess, data folder, model folder)."""
  case = ROWS[name]
  data, model = folder / "data", folder / "model_copy"
  shutil.copytree(corpus, data)
  shutil.copytree(model_dir, model)
  if case.prepare:
    case.prepare(data, model)
  fill = lambda text: text.replace("{d}", str(data)).replace("{m}", str(model))
  before = _files(data, model)
  argv = ["-m", *(fill(part) for part in case.command)]
  if name in FRESH:
    result = subprocess.run([sys.executable, *argv], cwd=testutil.ROOT, input=case.stdin,
                            capture_output=True, timeout=300)
  else:
    result = forked.run(argv, testutil.ROOT, stdin=case.stdin, text=False,
                        file_limit=case.file_limit)
  written = sorted(path for path, stamp in _files(data, model).items() if before.get(path) != stamp)
  return result, data, model, written


def _files(*folders) -> dict:
  """{path: (size, modification time)} of every file and folder under `folders`."""
  return {path: (path.stat().st_size, path.stat().st_mtime_ns)
          for folder in folders for path in folder.glob("**/*")}


@pytest.fixture(scope="module")
def results(tmp_path_factory, tiny_model_dir):
  """Every row's run, three at a time (each is mostly a TensorFlow start-up)."""
  corpus = tmp_path_factory.mktemp("corpus")
  write_corpus(corpus)
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    futures = {name: pool.submit(_run, name, corpus, tiny_model_dir,
                                 tmp_path_factory.mktemp("row"))
               for name in ROWS}
    return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", ROWS)
def test_bad_input_is_one_line_error(name, results):
  result, data, model, written = results[name]
  fill = lambda text: text.replace("{d}", str(data)).replace("{m}", str(model))
  stderr = result.stderr.decode("utf-8", "replace")
  assert result.returncode == 1, stderr
  assert "Traceback" not in stderr, stderr
  last = stderr.strip().splitlines()[-1]
  assert _matches(last, fill(ROWS[name].message)), last
  # no partial output: no temporary file or checkpoint folder, and each checkpoint index the
  # run wrote is whole (a save that failed, as on a full disk, removed its files)
  partial = [path for folder in (data, model) for path in folder.glob("**/*")
             if TEMPORARY_MARK in path.name or path.name.endswith("_temp")]
  assert not partial, partial
  for index in (path for path in written if path.suffix == ".index"):
    tf.train.load_checkpoint(str(index.with_suffix("")))
