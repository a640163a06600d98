"""What every tool shares: the process set-up, flag parsing with one-line errors, this
project's INFO lines, and the runner that ends a user error in one line.

The tools import the library inside their `main`, after `run` has set up the process: the
environment below must be in place before TensorFlow loads.
"""

import contextlib
import logging as std_logging
import os
import re
import sys
import warnings

from absl import app, flags, logging

from common.errors import UserError
from tf_transformer.bin import stderr_filter
from tf_transformer.config import ConfigError


class FlagError(ConfigError):
  """A flag is missing, out of range or contradicts another; the message names it."""


# The config fields whose flag has another name: {field: flag} (export_saved_model's batching)
FLAG_OF_FIELD = {"max_batch_size": "batching_max_size",
                 "allowed_batch_sizes": "batching_allowed_sizes",
                 "batch_timeout_micros": "batching_timeout_micros",
                 "num_batch_threads": "batching_threads",
                 "max_enqueued_batches": "batching_max_enqueued"}

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PACKAGES = tuple(os.path.join(_ROOT, name) + os.sep
                  for name in ("tf_transformer", "data_pipeline", "export", "common"))

TENSORFLOW_ENVIRONMENT = {
    # TensorFlow's C++ INFO/WARNING lines drown the progress bar; errors still show.
    "TF_CPP_MIN_LOG_LEVEL": "2",
    # TF's default CPU allocator hands large buffers back to the kernel, which zeroes fresh
    # pages on every step (a third of a CPU step's time); its BFC allocator keeps and reuses
    # them.
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
}


def set_tensorflow_environment():
  """Sets TENSORFLOW_ENVIRONMENT where the environment does not say otherwise. Call it before
  TensorFlow loads (the tools, the benchmarks and the tests do)."""
  for name, value in TENSORFLOW_ENVIRONMENT.items():
    os.environ.setdefault(name, value)


def set_up_process():
  """What a tool's process needs before TensorFlow loads: its environment, and stderr without
  TensorFlow's C++ start-up lines."""
  set_tensorflow_environment()
  stderr_filter.filter_stderr()


def _own_info_only(record) -> bool:
  """Other libraries' INFO lines are chatter to a user: TensorFlow's (checkpoint sharding,
  asset writing), matplotlib's (its font cache, built on the first run in a new home)."""
  return record.levelno >= std_logging.WARNING or record.pathname.startswith(_PACKAGES)


def start(argv):
  """What every tool's main does first: refuse stray arguments, set up logging.

  absl's verbosity sets the root logger's level, so every library's records reach absl's
  handler on the root logger; the filter sits on that handler, which sees them all."""
  if len(argv) > 1:
    raise UserError(f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value)")
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(_own_info_only)


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
  """absl's parsing, with a bad, missing or out-of-range flag, flagfile or value as one line
  naming it."""
  try:
    _check_flagfiles(argv[1:])
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = str(e).replace("ERROR:: ", "").strip().splitlines()[0]
    missing = re.fullmatch(r"flag --(\w+)=None: Flag --\1 must have a value other than None\.",
                           message)
    if missing:
      message = f"--{missing.group(1)} is required"
    sys.exit(f"error: {message} (see --helpfull)")


def describe(error: BaseException) -> str:
  """One line for a user error: an OSError as "path: reason", others by their message."""
  if isinstance(error, OSError) and error.strerror:
    where = error.filename if error.filename is not None else ""
    return f"{where}: {error.strerror}" if where else error.strerror
  tf = sys.modules.get("tensorflow")
  if tf is not None and isinstance(error, tf.errors.OpError):
    return (error.message or type(error).__name__).strip().splitlines()[0][:300]
  if isinstance(error, UserError):  # its fields as the flags of their names
    return error.as_flags(FLAG_OF_FIELD).strip().splitlines()[0]
  return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _user_errors() -> tuple:
  """The exception types that mean bad input, not a bug. TensorFlow's I/O errors count only
  where TensorFlow is loaded: the download tool runs without it."""
  tf = sys.modules.get("tensorflow")
  return (UserError, TimeoutError, OSError) + ((tf.errors.OpError,) if tf is not None else ())


def _list_key_flags(main):
  """--helpshort lists the key flags of the program's main module: make them the shared flags
  (tf_transformer.bin.shared_flags) and the tool's own, however the tool was started (python -m, a
  console command, the tf_transformer.train alias)."""
  program = sys.argv[0]
  for module_name in ("tf_transformer.bin.shared_flags", main.__module__):
    for flag in flags.FLAGS.get_flags_for_module(module_name):
      flags.FLAGS.register_key_flag_for_module(program, flag)


@contextlib.contextmanager
def reporting_cut_lines(where: str, unit: str = "line"):
  """Shows each inference.InputCutWarning of the block as a line "warning: `where`: lines ...
  were cut at --max_length=N subword pieces: ..." on stderr, its sentences numbered as the
  `unit`s ("line", say) of the input `where` names."""
  from tf_transformer.inference import InputCutWarning
  with warnings.catch_warnings():
    warnings.simplefilter("always", InputCutWarning)
    shown = warnings.showwarning

    def show(message, category, *args, **kwargs):
      if not isinstance(message, InputCutWarning):
        return shown(message, category, *args, **kwargs)
      print(f"warning: {where}: {message.numbers(unit)} cut at --max_length="
            f"{message.max_source_length} subword pieces: the answer is that of the first "
            "pieces", file=sys.stderr, flush=True)

    warnings.showwarning = show
    yield


def run(main, required_flags: tuple[str, ...] = ()):
  """Runs a tool: sets up the process, parses the flags (`required_flags` must be given), then
  runs `main(argv)`; a user error (a UserError, an OSError such as a full disk or an unwritable
  folder, a TensorFlow I/O error) ends the process with one line "error: ..." and exit code 1,
  never a traceback."""
  set_up_process()
  flags.mark_flags_as_required(required_flags)
  _list_key_flags(main)

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
