"""common/errors.py: a user error's message names settings as config fields in the library and
as flags in the tools."""

from common.errors import UserError
from tf_transformer.bin import cli


def test_fields_read_as_settings_in_the_library_and_as_flags_in_the_tools():
  error = UserError("{path}: lower {learning_rate:name} or set {clip_norm}",
                    learning_rate=None, clip_norm=1.0)
  assert str(error) == "{path}: lower learning_rate or set clip_norm=1.0"
  assert error.as_flags() == "{path}: lower --learning_rate or set --clip_norm=1.0"
  assert cli.describe(error) == error.as_flags()


def test_a_field_whose_flag_has_another_name():
  error = UserError("export with a smaller {max_batch_size}", max_batch_size=8)
  assert str(error) == "export with a smaller max_batch_size=8"
  assert cli.describe(error) == "export with a smaller --batching_max_size=8"


def test_braces_that_name_no_field_stay():
  """A path or a value in the message may hold braces: only the named fields are replaced."""
  error = UserError("/data/{x}/a {b:name} {'k': 1} {c}", b=None)
  assert str(error) == "/data/{x}/a b {'k': 1} {c}"
  plain = UserError("{model_dir:name} as written")
  assert str(plain) == plain.as_flags() == "{model_dir:name} as written"
