"""The translate command: order, empty lines, n-best, streaming, scoring, alignments,
one-line errors."""

import queue
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline.token_ids import EOS_ID, PAD_ID
from tests import testutil
from tf_transformer import decoding

from tf_transformer import checkpoints
from tf_transformer.bin import translation_io
from tf_transformer.config import DecodeConfig
from tf_transformer import loading
from tf_transformer.inference import InferenceFunctions, TranslationModel
from tf_transformer.length_batching import count_words

LINES = ["aa bb cc", "", "dd ee", "ff", "", "gg hh ii jj"]


def translate(model_dir, *args, stdin=None):
  """Runs the translate CLI over the model directory (None: the arguments name the model)."""
  model = [f"--model_dir={model_dir}", "--beam_size=2"] if model_dir else []
  return testutil.run_cli("tf_transformer.bin.translate", "--flagfile=flags/tiny.cfg", *model,
                          "--extra_decode_length=4", *args, stdin=stdin)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
  """The model in-process, with the search of `translate()`'s flags (tiny.cfg's max_length)."""
  return loading.load_model_dir(
      str(tiny_model_dir), "en", "de",
      DecodeConfig(beam_size=2, max_source_length=32, extra_decode_length=4))


def test_translate_keeps_order_and_empty_lines(tiny_model_dir, tmp_path):
  source = testutil.write_lines(tmp_path / "input.txt", LINES)
  from_file = translate(tiny_model_dir, f"--input={source}", f"--output={tmp_path / 'out.txt'}")
  assert from_file.returncode == 0, from_file.stderr
  outputs = (tmp_path / "out.txt").read_text().split("\n")[:-1]
  assert len(outputs) == len(LINES)
  assert outputs[1] == "" and outputs[4] == "" and all(outputs[i] for i in (0, 2, 3, 5))
  # the same sentences through stdin, in another order, give the same translations
  shuffled = [LINES[i] for i in (5, 3, 2, 0)]
  piped = translate(tiny_model_dir, stdin="\n".join(shuffled) + "\n")
  assert piped.returncode == 0, piped.stderr
  assert piped.stdout.split("\n")[:-1] == [outputs[i] for i in (5, 3, 2, 0)]


def test_translate_nbest_is_sorted_and_an_ensemble_of_the_model_gives_it(tiny_model_dir):
  result = translate(tiny_model_dir, "--nbest=2", stdin="aa bb cc\ndd ee\n")
  assert result.returncode == 0, result.stderr
  # TensorFlow's C++ start-up lines ("I0000 00:00:..." and absl's notice) are filtered out
  assert not re.search(r"^([IWE]0000 |WARNING: All log messages)", result.stderr, re.M), (
      result.stderr)
  rows = [line.split(" ||| ") for line in result.stdout.strip().split("\n")]
  assert [row[0] for row in rows] == ["0", "0", "1", "1"]
  for first, second in ((rows[0], rows[1]), (rows[2], rows[3])):
    assert float(first[2]) >= float(second[2])
  # the model ensembled with itself (in place of the flagfile's --model_dir): the same lines
  ensembled = translate(tiny_model_dir, "--nbest=2",
                        f"--ensemble={tiny_model_dir},{tiny_model_dir}", "--ensemble_weights=2,1",
                        stdin="aa bb cc\ndd ee\n")
  assert ensembled.returncode == 0, ensembled.stderr
  assert [line.split(" ||| ")[:2] for line in ensembled.stdout.strip().split("\n")] == [
      row[:2] for row in rows]


def test_bad_inputs_are_one_line_errors(tiny_model_dir, tmp_path):
  (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\xfe broken\n")
  source = testutil.write_lines(tmp_path / "source.txt", ["aa", "bb", "cc"])
  target = testutil.write_lines(tmp_path / "target.txt", ["aa", "bb"])
  cases = [
      (translate(tiny_model_dir, f"--input={tmp_path / 'bad.txt'}"),
       f"error: {tmp_path / 'bad.txt'}:2: not valid UTF-8"),
      (translate(tmp_path / "missing"), f"error: {tmp_path / 'missing'}: no such directory"),
      (translate(tiny_model_dir, "--beam_size=0"),
       "error: flag --beam_size=0: 0 is not a positive integer (see --helpfull)"),
      (translate(None, f"--saved_model={tmp_path}"),
       f"error: {tmp_path}: no saved_model.pb (give a version folder such as "
       "exports/<name>/<version>)"),
      (translate(tiny_model_dir, "--score", f"--input={source}", f"--targets={target}"),
       f"error: {source} has 3 lines but {target} has 2; they must be line-aligned"),
      (translate(tiny_model_dir, f"--input={source}", f"--target_prefix={target}"),
       f"error: {target} has 2 lines but {source} has 3; they must be line-aligned"),
      (translate(tiny_model_dir, f"--target_prefix={target}", "--stream",
                 stdin="aa\nbb\ncc\n"),
       "error: line 3 of the input has no target prefix: the prefixes must be line-aligned "
       "with the input"),
  ]
  for result, message in cases:
    testutil.assert_one_line_error(result, message)


def _read_line(stream, timeout: float) -> str:
  """stream.readline(), or a test failure after `timeout` seconds without a line."""
  lines = queue.Queue()
  threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
  try:
    return lines.get(timeout=timeout)
  except queue.Empty:
    pytest.fail(f"no answer line within {timeout} s")


def test_stream_answers_each_line_before_reading_the_next(tiny_model_dir, model, tmp_path):
  command = [sys.executable, "-m", "tf_transformer.bin.translate", "--flagfile=flags/tiny.cfg",
             f"--model_dir={tiny_model_dir}", "--beam_size=2", "--extra_decode_length=4",
             "--stream"]
  with open(tmp_path / "stderr.txt", "w") as stderr:
    process = subprocess.Popen(command, cwd=testutil.ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=stderr, text=True)
  try:
    answers = []
    for line in ("aa bb cc", ""):
      process.stdin.write(line + "\n")
      process.stdin.flush()
      answers.append(_read_line(process.stdout, timeout=120))  # stdin still open
    process.stdin.close()
    assert process.wait(timeout=60) == 0, (tmp_path / "stderr.txt").read_text()
  finally:
    if process.poll() is None:
      process.kill()
  best = model.translate(["aa bb cc"])[0]
  assert answers == [best + "\n", "\n"]


def test_stream_writes_each_answer_before_the_next_read():
  events = []

  def translate_nbest(texts):
    texts = [text.decode() for text in texts.numpy()]
    return {"outputs": tf.constant([[text[::-1], text] for text in texts]),
            "scores": tf.constant([[-1.0, -2.0]] * len(texts))}

  def lines():
    for line in ("ab", "", "cd"):
      events.append(("read", line))
      yield line

  class Out:
    def write(self, text):
      events.append(("write", text))

    def flush(self):
      events.append(("flush",))

  fake = TranslationModel("fake", False, DecodeConfig(beam_size=2), lambda config:
                          InferenceFunctions(translate_nbest, *[None] * 7, count_words))
  translation_io.translate_stream(fake, lines(), Out(), nbest=2)
  assert events == [("read", "ab"), ("write", "0 ||| ba ||| -1.0000\n0 ||| ab ||| -2.0000\n"),
                    ("flush",), ("read", ""), ("write", "1 |||  ||| 0.0000\n"), ("flush",),
                    ("read", "cd"), ("write", "2 ||| dc ||| -1.0000\n2 ||| cd ||| -2.0000\n"),
                    ("flush",)]


def test_lines_cut_at_max_length_are_named_and_still_answered(tiny_model_dir, tmp_path):
  """One warning line names the lines cut (source or target), after every answer is written."""
  long = " ".join(["aa", "bb"] * 20)  # 40 pieces, over tiny.cfg's --max_length=32
  source = testutil.write_lines(tmp_path / "source.txt", ["aa", long, "", long, "bb"])
  result = translate(tiny_model_dir, f"--input={source}")
  assert result.returncode == 0, result.stderr
  assert len(result.stdout.split("\n")[:-1]) == 5
  warnings = [line for line in result.stderr.splitlines() if line.startswith("warning")]
  assert warnings == [
      f"warning: {source}: lines 2, 4 were cut at --max_length=32 subword pieces: the answer "
      "is that of the first pieces"]
  target = testutil.write_lines(tmp_path / "target.txt", ["aa", "bb", long, "", ""])
  scored = translate(tiny_model_dir, "--score", f"--input={source}", f"--targets={target}")
  assert scored.returncode == 0, scored.stderr
  assert f"warning: {source} and {target}: lines 2, 3, 4 were cut" in scored.stderr


def test_score_equals_the_forced_decoding_score(tiny_model_dir, tmp_path):
  sources = ["aa bb cc", "dd ee", "", "ff gg hh ii jj", "aa bb cc"]
  targets = ["vv vv", "ss", "oo pp", "", "qq rr ss tt"]
  source = testutil.write_lines(tmp_path / "source.txt", sources)
  target = testutil.write_lines(tmp_path / "target.txt", targets)
  # token batches of at most 8 tokens: pairs are split and sorted, and must come back in order
  result = translate(tiny_model_dir, "--score", f"--input={source}", f"--targets={target}",
                     "--batch_tokens=8", "--alpha=0.8")
  assert result.returncode == 0, result.stderr
  rows = [line.split(" ||| ") for line in result.stdout.split("\n")[:-1]]
  assert [row[1] for row in rows] == targets
  model, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
  for (score, _), source_text, target_text in zip(rows, sources, targets):
    ids = [side.tokenize(tf.constant([text])).to_tensor(default_value=PAD_ID)
           for side, text in ((vocabulary.source, source_text), (vocabulary.target, target_text))]
    source_ids, target_ids = (tf.concat([row, [[EOS_ID]]], axis=1) for row in ids)
    expected = decoding.score(model, source_ids, target_ids, alpha=0.8)[0].numpy()
    assert float(score) == pytest.approx(expected, abs=1e-4)


def test_print_alignment_appends_piece_pairs(tiny_model_dir, model, tmp_path):
  source = testutil.write_lines(tmp_path / "input.txt", LINES)
  result = translate(tiny_model_dir, f"--input={source}", "--print_alignment")
  assert result.returncode == 0, result.stderr
  rows = [line.split(" ||| ") for line in result.stdout.split("\n")[:-1]]
  best = model.translate(LINES)
  assert [row[0] for row in rows] == best
  pieces = model.count_tokens(LINES, "source")  # + </s>
  for text, (_, alignment), count in zip(LINES, rows, pieces):
    pairs = [tuple(map(int, re.fullmatch(r"(\d+)-(\d+)", pair).groups()))
             for pair in alignment.split()]
    if not text.strip():
      assert pairs == []
      continue
    # every target piece but </s>, in order, to a source piece other than </s>
    assert pairs and [t for _, t in pairs] == list(range(len(pairs)))
    assert all(0 <= s < count - 1 for s, _ in pairs)


def test_target_prefix_begins_each_translation(tiny_model_dir, model, tmp_path):
  source = testutil.write_lines(tmp_path / "input.txt", LINES)
  prefixes = ["ss tt", "uu", "", "vv ww xx", "", "ss"]
  prefix = testutil.write_lines(tmp_path / "prefix.txt", prefixes)
  results = [translate(tiny_model_dir, f"--input={source}", f"--target_prefix={prefix}", *mode)
             for mode in ((), ("--stream",), ("--nbest=2",))]
  for result in results:
    assert result.returncode == 0, result.stderr
  batched, streamed, nbest = (result.stdout.split("\n")[:-1] for result in results)
  assert batched == streamed == model.translate(LINES, target_prefix=prefixes)
  target = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")[1].target
  plain = model.translate(LINES)
  for line, prefix_text, output, best in zip(LINES, prefixes, batched, plain):
    if not line:
      assert output == ""
    elif not prefix_text:
      assert output == best
    else:
      pieces = target.detokenize(target.tokenize(tf.constant([prefix_text])))[0].numpy().decode()
      assert output.startswith(pieces) and output != best
  firsts = {}  # the first hypothesis of each index (a blank line has one, the others two)
  for row in nbest:
    index, text, _ = row.split(" ||| ")
    firsts.setdefault(int(index), text)
  assert list(firsts.values()) == batched


def test_a_saved_model_translates_scores_and_aligns_as_its_model_directory(
    reversal_model, reversal_export, tmp_path):
  model_dir, dev, _ = reversal_model
  # the last source has over 10 pieces: both cut it to --max_length=10
  sources = [source for source, _ in dev[:8]] + ["", " ".join(f"w{n % 13}" for n in range(15))]
  targets = [target for _, target in dev[:8]] + ["w1", "w2 w1"]
  source = testutil.write_lines(tmp_path / "source.txt", sources)
  target = testutil.write_lines(tmp_path / "target.txt", targets)
  library = loading.load_model_dir(str(model_dir), "src", "tgt",
                                   testutil.REVERSAL_EXPORT_SEARCH)
  saved = (None, f"--saved_model={reversal_export}", f"--input={source}")
  best, nbest, scored, aligned, sampled = (translate(*saved, *args) for args in (
      (), ("--nbest=2",), ("--score", f"--targets={target}"), ("--print_alignment",),
      ("--strategy=sample", "--nbest=3", "--seed=9", "--batch_size=3")))
  for result in (best, nbest, scored, aligned, sampled):
    assert result.returncode == 0, result.stderr

  outputs = best.stdout.split("\n")[:-1]
  assert outputs == library.translate(sources)
  # trained to reverse (300 steps): most dev sentences come back reversed
  assert sum(output == reference for output, reference in zip(outputs, targets[:8])) >= 4
  assert outputs[8] == "" and outputs[9]
  rows = [row.split(" ||| ") for row in nbest.stdout.split("\n")[:-1]]
  expected = [(str(index), hypothesis) for index, hypotheses in
              enumerate(library.translate(sources, nbest=2)) for hypothesis in hypotheses]
  assert [(index, text) for index, text, _ in rows] == [(i, h.text) for i, h in expected]
  np.testing.assert_allclose([float(score) for _, _, score in rows],
                             [h.score for _, h in expected], atol=1e-4)
  rows = [row.split(" ||| ") for row in scored.stdout.split("\n")[:-1]]
  assert [text for _, text in rows] == targets
  np.testing.assert_allclose([float(score) for score, _ in rows], library.score(sources, targets),
                             atol=1e-4)
  alignments = library.align(sources)
  assert aligned.stdout.split("\n")[:-1] == [
      f"{text} ||| {' '.join(f'{s}-{t}' for s, t in pairs)}" for text, pairs in zip(*alignments)]
  # every dev sentence ends with </s>, aligned like the rest: one pair per piece but </s>
  assert all(pairs for pairs in alignments[1][:8])
  # the sample signature: a sentence's draws are its seeds', in any batch
  rows = [row.split(" ||| ") for row in sampled.stdout.split("\n")[:-1]]
  expected = [(str(index), hypothesis) for index, hypotheses in enumerate(
      library.translate(sources, strategy="sample", nbest=3, seed=9)) for hypothesis in hypotheses]
  assert [(index, text) for index, text, _ in rows] == [(i, h.text) for i, h in expected]
  np.testing.assert_allclose([float(score) for _, _, score in rows],
                             [h.score for _, h in expected], atol=1e-4)
