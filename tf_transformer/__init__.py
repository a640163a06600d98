"""tf-transformer: the Transformer of "Attention Is All You Need" for machine translation.

    import tf_transformer
    model = tf_transformer.load("models/multi30k_en_de")  # or a SavedModel version folder
    model.translate(["A dog runs on the beach."], beam_size=4)
"""


def load(path: str, **kwargs):
  """A trained model (a model directory or an exported SavedModel) to translate and score
  with: see `tf_transformer.loading.load` for the arguments and
  `tf_transformer.inference.TranslationModel` for its methods. TensorFlow is imported here, not
  when the package is: the command-line tools set its environment first."""
  from tf_transformer import loading
  return loading.load(path, **kwargs)


def __getattr__(name: str):
  """`tf_transformer.InputCutWarning` (inference.py), imported when first named, as `load`."""
  if name == "InputCutWarning":
    from tf_transformer.inference import InputCutWarning
    return InputCutWarning
  raise AttributeError(f"module 'tf_transformer' has no attribute {name!r}")
