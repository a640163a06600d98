"""The base class of every error a user can fix, shown by the tools as one line."""

import re


class UserError(Exception):
  """A problem the user can fix (a setting, a file, a model directory), in one line naming it.

  The tools (tf_transformer/bin) print such an error as `error: <message>` and exit with code 1,
  never with a traceback; every package's own error classes derive from it.

  With `fields`, the message is a template naming each setting: "{name}" reads "name=value" in
  the library, and in the tools the flag of that name with the value (`as_flags`);
  "{name:name}" is the name alone, or the flag alone.
  """

  def __init__(self, message: str = "", **fields):
    self.template, self.fields = message, fields
    super().__init__(self._named("") if fields else message)

  def _named(self, prefix: str, renamed: dict | None = None) -> str:
    def field(match):
      name, alone = match.group(1), match.group(2)
      if name not in self.fields:  # braces of a path or a value in the message
        return match.group(0)
      shown = prefix + (renamed or {}).get(name, name)
      return shown + ("" if alone else f"={self.fields[name]}")
    return _FIELD.sub(field, self.template)

  def as_flags(self, renamed: dict | None = None) -> str:
    """The message naming its fields as the tools' flags (`renamed`: {field: flag name} where
    they differ)."""
    return self._named("--", renamed) if self.fields else str(self)


# "{name}" or "{name:name}"
_FIELD = re.compile(r"\{(\w+)(:name)?\}")
