"""Translates text, one sentence a line, or scores given translations:
`python -m tf_transformer.bin.translate (--saved_model=DIR | --flagfile=F --model_dir=DIR |
--flagfile=F --ensemble=DIR1,DIR2[,...] [--ensemble_weights=W1,W2,...])
[--input F] [--output F] [--beam_size --alpha --nbest --batch_size --batch_tokens]
[--strategy=sample --sampling_topk --sampling_topp --sampling_temperature --seed]
[--stream] [--print_alignment] [--score --targets F] [--target_prefix F] [--constraints F]`.

Output: one line per input line, in order; an empty line stays empty. With --nbest > 1, each
hypothesis is a line `index ||| translation ||| score` (the Moses n-best format). With
--print_alignment, `translation ||| 0-0 1-2 2-1`: for each target subword piece, `src-tgt`, the
0-based positions of the source piece it attends to most and of the target piece (</s> left
out). With --score, `score ||| target` lines: the log-probability of each target given its
source line over the length penalty ((5 + length) / 6)^alpha, as beam search scores. With
--target_prefix, each translation starts with the line of that file (its subword pieces forced,
the search continuing after them; an empty line forces nothing). With --constraints, every
translation of a line contains each tab-separated phrase of that file's line, and none of those
written with a leading "!" (terminology; docs/translating.md). With --strategy=sample, each
output is drawn at random from the model's distribution (back-translation), --nbest of them a
line; a line's draws depend on --seed and its line number alone.

The input is read whole, sorted by length and translated in batches of --batch_size sentences
or, when --batch_tokens is given (a flagfile counts), of at most --batch_tokens tokens counting
padding: rows x the longest row's subword tokens + </s> with --model_dir, whitespace words + 1
with --saved_model. With --stream, or when stdin is a terminal, each line is answered as soon
as it is read.
"""

import contextlib
import sys

from absl import flags, logging

from tf_transformer.bin import cli, shared_flags
from tf_transformer.bin.cli import FlagError

flags.DEFINE_string("input", None, "Text to translate, one sentence a line (default: stdin).")
flags.DEFINE_bool("stream", False,
                  "Answer each input line as soon as it is read (the default when stdin is a "
                  "terminal) instead of reading all, sorting by length and batching.")
flags.DEFINE_bool("score", False,
                  "Score the translations of --targets (line-aligned with --input) instead of "
                  "translating; prints 'score ||| target' lines.")
flags.DEFINE_string("targets", None, "With --score: the translations to score, one a line.")
flags.DEFINE_bool("print_alignment", False,
                  "Append ' ||| ' and the hard alignment 'src-tgt ...' (0-based subword piece "
                  "indices, from the align signature) to each translation.")

flags.DEFINE_string("target_prefix", None,
                    "Translations start with these: one prefix a line, line-aligned with "
                    "--input (an empty line: none). For interactive and post-editing tools.")

flags.DEFINE_string("constraints", None,
                    "Terminology: one line per --input line of tab-separated target phrases "
                    "that its translations must contain (as whole words, in any order), or must "
                    "not contain when written with a leading '!'; an empty line: none.")

FLAGS = flags.FLAGS


def _check_modes():
  """Flags that translate cannot combine, as FlagErrors."""
  if FLAGS.score and not FLAGS.targets:
    raise FlagError("--score needs --targets (the translations to score, one a line, "
                           "line-aligned with --input)")
  if FLAGS.targets and not FLAGS.score:
    raise FlagError("--targets is read only with --score")
  if FLAGS.score and (FLAGS.stream or FLAGS.print_alignment or FLAGS.nbest > 1):
    raise FlagError("--score does not combine with --stream, --print_alignment or --nbest")
  for name in ("target_prefix", "constraints"):
    if FLAGS[name].value and (FLAGS.score or FLAGS.print_alignment):
      raise FlagError(f"--{name} does not combine with --score or --print_alignment")
  if FLAGS.print_alignment and FLAGS.nbest > 1:
    raise FlagError("--print_alignment aligns the best translation only: drop --nbest")
  if FLAGS.strategy == "sample" and (FLAGS.score or FLAGS.print_alignment):
    raise FlagError("--strategy=sample translates: --score and --print_alignment use the "
                    "model as it is (forced decoding, beam search)")


def main(argv):
  cli.start(argv)
  from common import files
  from common.progress import ProgressBar
  from tf_transformer.bin import translation_io

  decode_config = shared_flags.decode_config_from_flags()
  search = shared_flags.per_call_search()
  _check_modes()
  if FLAGS.constraints:  # before the model loads
    from tf_transformer.decoding import strategies
    strategies.check_constraints_allowed(decode_config)
  if FLAGS.score:  # both files are checked before the model loads
    sources = translation_io.read_lines(FLAGS.input)
    targets = translation_io.read_lines(FLAGS.targets)
    if len(sources) != len(targets):
      raise FlagError(f"{FLAGS.input or '<stdin>'} has {len(sources)} lines but "
                             f"{FLAGS.targets} has {len(targets)}; they must be line-aligned")
  model = shared_flags.model_from_flags(decode_config)
  batch_tokens = FLAGS.batch_tokens if FLAGS["batch_tokens"].present else None
  batch_size = FLAGS.batch_size if batch_tokens is None or FLAGS["batch_size"].present else None
  batching = dict(batch_size=batch_size, batch_tokens=batch_tokens)
  streaming = FLAGS.stream or (not FLAGS.score and not FLAGS.input and sys.stdin.isatty())
  where = FLAGS.input or "<stdin>"
  if FLAGS.score:
    where += f" and {FLAGS.targets}"
  with (files.atomic_file(FLAGS.output) if FLAGS.output
        else contextlib.nullcontext(sys.stdout)) as out, cli.reporting_cut_lines(where):
    if streaming:
      if sys.stdin.isatty() and not FLAGS.input:
        logging.info("translating each line as it is typed (Ctrl-D ends)")
      try:
        prefixes, constraints = (translation_io.iter_lines(FLAGS[name].value)
                                 if FLAGS[name].value else None
                                 for name in ("target_prefix", "constraints"))
        with _naming_constraint_lines():
          translation_io.translate_stream(model, translation_io.iter_lines(FLAGS.input), out,
                                          FLAGS.nbest, FLAGS.print_alignment, prefixes, search,
                                          constraints)
      except KeyboardInterrupt:
        sys.exit(130)  # Ctrl-C ends a typed session like Ctrl-D, without a traceback
      return
    texts = sources if FLAGS.score else translation_io.read_lines(FLAGS.input)
    prefixes = _read_aligned("target_prefix", len(texts)) if FLAGS.target_prefix else None
    constraints = None
    if FLAGS.constraints:
      constraints = [translation_io.constraint_phrases(line)
                     for line in _read_aligned("constraints", len(texts))]
    # the bar prints on stdout: only when the answers go to a file
    progress = ProgressBar(len(texts), unit="pair" if FLAGS.score else "sentence") \
        if FLAGS.output else None
    if FLAGS.score:
      out.writelines(translation_io.score_lines(model, sources, targets, progress=progress,
                                                **batching))
    else:
      with _naming_constraint_lines():
        out.writelines(translation_io.translation_lines(
            model, texts, FLAGS.nbest, FLAGS.print_alignment, target_prefix=prefixes,
            search=search, constraints=constraints, progress=progress, **batching))
    if progress is not None:
      progress.close()


def _read_aligned(name: str, count: int) -> list[str]:
  """The lines of the file of flag `name`, which must be as many as the input's."""
  from tf_transformer.bin import translation_io
  path = FLAGS[name].value
  lines = translation_io.read_lines(path)
  if len(lines) != count:
    raise FlagError(f"{path} has {len(lines)} lines but {FLAGS.input or '<stdin>'} has "
                    f"{count}; they must be line-aligned")
  return lines


@contextlib.contextmanager
def _naming_constraint_lines():
  """A ConstraintError as a FlagError naming --constraints' file and line."""
  from tf_transformer.decoding.lexical_constraints import ConstraintError
  try:
    yield
  except ConstraintError as e:
    raise FlagError(f"{FLAGS.constraints}:{e.sentence + 1}: {e.problem}") from None


def run():
  cli.run(main)


if __name__ == "__main__":
  run()
