"""Exporters: a trained model directory (or an ensemble's list of them) written in a format that
serves it, each under one contract, `exporter(model_dir, out_dir, options) -> the folder
written` with its module's `Options`, and registered by name (`register_exporter`).

- "saved_model" (saved_model.py): the next version of a TF Serving model folder, string in,
  string out (its contract: tf_transformer/serving/signatures.py).
- "ctranslate2" (ctranslate2.py, ct2_spec.py): a CTranslate2 model folder.
"""

from typing import Callable

_EXPORTERS: dict[str, Callable] = {}


def register_exporter(name: str):
  """A decorator that registers an exporter function under `name`."""
  def register(function):
    if name in _EXPORTERS:
      raise ValueError(f"an exporter named {name!r} is registered already")
    _EXPORTERS[name] = function
    return function
  return register


def exporter(name: str) -> Callable:
  """The exporter registered as `name` ("saved_model", "ctranslate2")."""
  if name not in _EXPORTERS:
    raise ValueError(f"no exporter named {name!r}; there are {sorted(_EXPORTERS)}")
  return _EXPORTERS[name]


def names() -> tuple:
  """The registered exporters' names."""
  return tuple(sorted(_EXPORTERS))


# the exporters register themselves as they are imported
from export import ctranslate2, saved_model  # noqa: E402,F401
