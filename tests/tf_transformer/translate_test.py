"""The translate command: order, empty lines, n-best, one-line errors."""

from tests import testutil

LINES = ["aa bb cc", "", "dd ee", "ff", "", "gg hh ii jj"]


def translate(model_dir, *args, stdin=None):
  """Runs the translate CLI over the model directory (None: the arguments name the model)."""
  model = [f"--model_dir={model_dir}", "--beam_size=2"] if model_dir else []
  return testutil.run_cli("tf_transformer.translate", "--flagfile=flags/tiny.cfg", *model,
                          "--extra_decode_length=4", *args, stdin=stdin)


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


def test_translate_nbest_is_sorted(tiny_model_dir):
  result = translate(tiny_model_dir, "--nbest=2", stdin="aa bb cc\ndd ee\n")
  assert result.returncode == 0, result.stderr
  rows = [line.split(" ||| ") for line in result.stdout.strip().split("\n")]
  assert [row[0] for row in rows] == ["0", "0", "1", "1"]
  for first, second in ((rows[0], rows[1]), (rows[2], rows[3])):
    assert float(first[2]) >= float(second[2])


def test_bad_inputs_are_one_line_errors(tiny_model_dir, tmp_path):
  (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\xfe broken\n")
  cases = [
      (translate(tiny_model_dir, f"--input={tmp_path / 'bad.txt'}"),
       f"error: {tmp_path / 'bad.txt'}:2: not valid UTF-8"),
      (translate(tmp_path / "missing"), f"error: {tmp_path / 'missing'}: no such directory"),
      (translate(tiny_model_dir, "--beam_size=0"),
       "error: flag --beam_size=0: 0 is not a positive integer (see --helpfull)"),
      (translate(None, f"--saved_model={tmp_path}"),
       f"error: {tmp_path}: no saved_model.pb (give a version folder such as "
       "exports/<name>/<version>)"),
  ]
  for result, message in cases:
    testutil.assert_one_line_error(result, message)
