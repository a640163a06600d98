"""A trained model as a CTranslate2 model folder (model.bin, config.json, the vocabularies),
with the SentencePiece model(s) beside it; the tool is tf_transformer/bin/export_ctranslate2.py.
"""

import dataclasses
import os
import shutil

from common import files
from data_pipeline import tokenizer
from export import register_exporter
from export.ct2_spec import transformer_spec
from tf_transformer.checkpoints import load_for_inference


@dataclasses.dataclass(frozen=True)
class Options:
  """src_lang, tgt_lang: the languages whose subword models the model directory reads;
  quantization: CTranslate2's weight type; checkpoint: checkpoints.choose_checkpoint's."""
  src_lang: str
  tgt_lang: str
  quantization: str = "float32"
  checkpoint: str = "final"


@register_exporter("ctranslate2")
def export(model_dir: str, output_dir: str, options: Options) -> str:
  """Converts the model of `model_dir`, at `options.checkpoint`, into the CTranslate2 folder
  `output_dir` (replaced if it exists); returns `output_dir`.

  Raises:
    ModelDirError: the model directory, its vocabulary or its checkpoint is unusable.
  """
  model, vocabulary, _ = load_for_inference(model_dir, options.src_lang, options.tgt_lang,
                                            options.checkpoint)
  return save(model, vocabulary, output_dir, options.quantization)


def save(model, vocabulary, output_dir: str, quantization: str = "float32") -> str:
  """Writes `model` (a Transformer) and its `vocabulary` (data_pipeline.tokenizer.Vocabulary)
  as the CTranslate2 folder `output_dir`, replacing it; returns `output_dir`."""
  from ctranslate2.converters.converter import Converter

  spec = transformer_spec(model, list(tokenizer.pieces(vocabulary.source)),
                          list(tokenizer.pieces(vocabulary.target)))

  class _SpecConverter(Converter):
    def _load(self):
      return spec

  with files.atomic_path(output_dir) as temporary:  # replaces an older export whole
    _SpecConverter().convert(temporary, quantization=quantization, force=True)
    for path in sorted({vocabulary.source_model_path, vocabulary.target_model_path}):
      shutil.copy(path, os.path.join(temporary, os.path.basename(path)))
  return output_dir
