"""The base class of every error a user can fix, shown by the tools as one line."""


class UserError(Exception):
  """A problem the user can fix (a flag, a file, a model directory), in one line naming it.

  The tools (tf_transformer/bin) print such an error as `error: <message>` and exit with code 1,
  never with a traceback; every package's own error classes derive from it.
  """
