"""Translates text, one sentence a line:
`python -m tf_transformer.translate (--saved_model=DIR | --flagfile=F --model_dir=DIR)
[--input F] [--output F] [--beam_size --alpha --nbest --batch_size]`.

Output: one line per input line, in order; an empty line stays empty. With --nbest > 1, each
hypothesis is a line `index ||| translation ||| score` (the Moses n-best format).
"""

import contextlib
import sys

import keras
from absl import flags

from tf_transformer import config, console
from tf_transformer.translator import load_translate_nbest, translate_texts

flags.adopt_module_key_flags(config)  # --helpshort lists the project's flags

FLAGS = config.FLAGS


def read_lines(path: str | None) -> list[str]:
  """The lines of `path` (stdin when None), or a FlagError naming the file and line."""
  try:
    stream = open(path, "rb") if path else sys.stdin.buffer
  except OSError as e:
    raise config.FlagError(f"{path}: cannot read ({e.strerror})") from None
  lines = []
  with stream:
    for number, line in enumerate(stream, start=1):
      try:
        lines.append(line.rstrip(b"\r\n").decode("utf-8"))
      except UnicodeDecodeError:
        raise config.FlagError(f"{path or '<stdin>'}:{number}: not valid UTF-8") from None
  return lines


def main(argv):
  console.start(argv)
  decode_config = config.decode_config_from_flags()
  if FLAGS.saved_model and (FLAGS["beam_size"].present or FLAGS["alpha"].present):
    raise config.FlagError("--beam_size and --alpha are fixed in a SavedModel at export")
  translate_nbest = load_translate_nbest(FLAGS.saved_model, FLAGS.model_dir, FLAGS.src_lang,
                                         FLAGS.tgt_lang, decode_config)
  texts = read_lines(FLAGS.input)
  with (console.output_file(FLAGS.output) if FLAGS.output
        else contextlib.nullcontext(sys.stdout)) as out:
    # the bar prints on stdout: only when the translations go to a file
    progress = keras.utils.Progbar(len(texts), unit_name="sentence") if FLAGS.output else None
    outputs, scores = translate_texts(translate_nbest, texts, FLAGS.batch_size, progress)
    for index, (nbest, nbest_scores) in enumerate(zip(outputs, scores)):
      if FLAGS.nbest == 1:
        out.write(nbest[0] + "\n")
      else:
        out.writelines(f"{index} ||| {hypothesis} ||| {score:.4f}\n"
                       for hypothesis, score in list(zip(nbest, nbest_scores))[:FLAGS.nbest])


if __name__ == "__main__":
  console.run(main)
