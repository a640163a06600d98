"""What the command-line tools share: one-line errors, this project's INFO lines, everyone's
warnings."""

import contextlib
import logging as std_logging
import os
import sys

from absl import app, flags, logging

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = tuple(os.path.join(_ROOT, name) + os.sep
                  for name in ("tf_transformer", "data_pipeline", "export"))


class UserError(Exception):
  """A problem the user can fix (a flag, a file, a model directory), in one line naming it."""


def _own_info_only(record) -> bool:
  """TensorFlow logs INFO chatter (checkpoint sharding, asset writing) through absl too."""
  return record.levelno >= std_logging.WARNING or record.pathname.startswith(_PACKAGES)


def start(argv):
  """What every CLI's main does first: refuse stray arguments, set up logging."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value)")
  logging.set_verbosity(logging.INFO)
  std_logging.getLogger("absl").addFilter(_own_info_only)


@contextlib.contextmanager
def output_file(path: str):
  """Opens `path` for writing text under a temporary name that becomes `path` only when the
  block ends without an error: opened before the work (an unwritable path fails at once), it
  never leaves a partial file or half-replaces an old one."""
  temporary = f"{path}.tmp-{os.getpid()}"
  try:
    try:
      f = open(temporary, "w", encoding="utf-8")
    except OSError as e:
      raise OSError(e.errno, e.strerror, path) from None  # the name the user gave
    with f:
      yield f
    os.replace(temporary, path)
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)


def _check_flagfiles(argv, seen=()):
  """absl skips a flagfile line that does not start with "-" (say "beam_size=5"): the user
  meant a flag, so it is an error naming the file and line. Nested flagfiles are checked too."""
  for arg in argv:
    if not arg.startswith("--flagfile="):
      continue
    path = arg.split("=", 1)[1]
    if path in seen or not os.path.isfile(path):
      continue  # absl reports a missing flagfile itself
    with open(path, encoding="utf-8", errors="replace") as f:
      lines = [line.strip() for line in f]
    for number, line in enumerate(lines, start=1):
      if line and not line.startswith(("-", "#", "//")):
        raise flags.Error(f"{path}:{number}: {line!r} is not a flag (write --name=value)")
    _check_flagfiles(lines, seen + (path,))


def _parse_flags(argv):
  """absl's parsing, with a bad flag, flagfile or value as one line naming it."""
  try:
    _check_flagfiles(argv[1:])
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = str(e).replace("ERROR:: ", "").strip().splitlines()[0]
    sys.exit(f"error: {message} (see --helpfull)")


def describe(error: BaseException) -> str:
  """One line for a user error: an OSError as "path: reason", others by their message."""
  if isinstance(error, OSError) and error.strerror:
    where = error.filename if error.filename is not None else ""
    return f"{where}: {error.strerror}" if where else error.strerror
  tf = sys.modules.get("tensorflow")
  if tf is not None and isinstance(error, tf.errors.OpError):
    return (error.message or type(error).__name__).strip().splitlines()[0][:300]
  return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _user_errors() -> tuple:
  """The exception types that mean bad input, not a bug. TensorFlow's I/O errors count only
  where TensorFlow is loaded: the download CLI starts without it."""
  from data_pipeline.corpora import CorpusError
  from data_pipeline.public_corpora import DownloadError
  tf = sys.modules.get("tensorflow")
  return (UserError, CorpusError, DownloadError, TimeoutError, OSError) + (
      (tf.errors.OpError,) if tf is not None else ())


def run(main):
  """app.run(main), where a user error (UserError and its kinds, an OSError such as a full
  disk or an unwritable folder, a TensorFlow I/O error) ends the process with one line
  "error: ..." and exit code 1, never a traceback."""

  def guarded(argv):
    try:
      main(argv)
    except Exception as e:  # noqa: BLE001  (re-raised below unless it is the user's)
      if not isinstance(e, _user_errors()):
        raise
      if sys.stdout.isatty():
        print(flush=True)  # ends a progress bar's line
      sys.exit(f"error: {describe(e)}")

  app.run(guarded, flags_parser=_parse_flags)
