"""The SavedModel exporter: a trained model (or an ensemble) as the next version of a TF
Serving model folder (tf_transformer/serving/export_format.py); the tool is
tf_transformer/bin/export_saved_model.py."""

import dataclasses

from absl import logging

from data_pipeline import lexical_shortlist
from export import register_exporter
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.checkpoints import load_ensemble_for_inference, load_for_inference
from tf_transformer.config import BatchingConfig, DataConfig, DecodeConfig
from tf_transformer.serving import export_format, signatures
from tf_transformer.serving.translator import Translator


@dataclasses.dataclass(frozen=True)
class Options:
  """What a SavedModel export fixes beside the weights.

  Attributes:
    src_lang, tgt_lang: the languages whose subword models the model directory reads.
    decode_config: the search fixed in the export (`translate_nbest` returns the whole beam).
    checkpoint: the weights (checkpoints.choose_checkpoint: final, best, latest, ...).
    precision: the weights of the matrix products (layers.precisions).
    shortlist_size: 0, or the target pieces each sentence's search may write.
    shortlist_per_source: the lexicon's target pieces per source piece.
    data_config: the training data the shortlist's lexicon is counted over.
    ensemble_weights: an ensemble's member weights (default: equal).
    batching: config.BatchingConfig of in-graph batching, or None.
    signatures: the names of the signatures to serve (serving/signatures.py); empty: all.
  """
  src_lang: str
  tgt_lang: str
  decode_config: DecodeConfig = DecodeConfig()
  checkpoint: str = "final"
  precision: str = "float32"
  shortlist_size: int = 0
  shortlist_per_source: int = 20
  data_config: DataConfig | None = None
  ensemble_weights: tuple = ()
  batching: BatchingConfig | None = None
  signatures: tuple = ()


@register_exporter("saved_model")
def export(model_dir, export_dir: str, options: Options) -> str:
  """Exports the model of `model_dir` at `options.checkpoint` as the next version of
  `export_dir`, with `decode_config`'s search fixed in it and `translate_nbest` returning the
  whole beam, its matrix products' weights in `precision` (see `Options` for each field).

  With `shortlist_size` (>= 2 and below the target vocabulary's size; 0: none) every search
  writes only that many target pieces for each sentence, its own whatever its batch
  (tf_transformer/decoding/shortlist.py), chosen with the lexicon of `shortlist_per_source` target
  pieces per source piece that is counted here over the training data of DataConfig
  `data_config` (data_pipeline/lexical_shortlist.py).

  A list of model directories is exported as their ensemble (decoding/ensemble.py), with
  `ensemble_weights` (one each; default: equal): the SavedModel holds every member's weights
  and runs one search over them; its version is the next free number.

  With `signatures`, the SavedModel serves those only (and has their warm-up requests): it
  saves, loads and takes memory in proportion (Python's loader rebuilds the functions of every
  signature). `load()` then answers what they answer, and refuses the rest in one line.

  With `batching` (config.BatchingConfig) the signatures of serving.signatures.BATCHED merge
  concurrent requests in-graph, and their warm-up requests have each of its allowed batch
  sizes of rows (serving/warmup.py), so that the merged searches are compiled at load.

  Returns:
    The version folder written, `export_dir`/<the checkpoint's step, or the next free number>.

  Raises:
    ModelDirError: the model directory, its vocabulary or its checkpoint is unusable.
    ValueError: a name of `signatures` is no signature of the contract.
    CorpusError: a shortlist's training data is missing.
  """
  names = signatures.chosen(options.signatures)
  src_lang, tgt_lang, checkpoint = options.src_lang, options.tgt_lang, options.checkpoint
  shortlist_size, shortlist_per_source = options.shortlist_size, options.shortlist_per_source
  precision, batching = options.precision, options.batching
  members = {}
  if isinstance(model_dir, str):
    model, vocabulary, step = load_for_inference(model_dir, src_lang, tgt_lang, checkpoint)
  else:
    model, vocabulary, steps = load_ensemble_for_inference(model_dir, src_lang, tgt_lang,
                                                           checkpoint, options.ensemble_weights)
    members = {"ensemble": list(model_dir), "ensemble_weights": list(model.weights),
               "checkpoint_steps": steps}
    step = 0  # no one checkpoint's step: the next free version
  lexicon = None
  if shortlist_size >= vocabulary.target_size:
    logging.info("shortlist_size=%d is not below the target vocabulary's %d pieces: the "
                 "search keeps the whole vocabulary", shortlist_size, vocabulary.target_size)
    shortlist_size = 0
  if shortlist_size:
    lexicon = lexical_shortlist.from_training_data(options.data_config, vocabulary,
                                                   shortlist_per_source)
  decode_config = dataclasses.replace(options.decode_config,
                                      nbest=options.decode_config.beam_size)
  module = Translator(model, vocabulary, decode_config, precision=precision,
                      shortlist_size=shortlist_size, lexicon=lexicon, batching=batching)
  # the model's target languages, several for a multilingual model whatever tgt_lang says
  trained_into = model_dir_lib.read_data(model_dir if isinstance(model_dir, str)
                                         else model_dir[0]).get("tgt_lang", tgt_lang)
  settings = {**dataclasses.asdict(decode_config), "checkpoint_step": step,
              "src_lang": src_lang, "tgt_lang": trained_into, "precision": precision,
              "shortlist_size": shortlist_size,
              "shortlist_per_source": shortlist_per_source if shortlist_size else 0,
              "batching": dataclasses.asdict(batching) if batching else None,
              "signatures": list(names), **members}
  path = export_format.save_version(module, module.signatures(names), export_dir,
                                    export_format.next_version(export_dir, step), settings,
                                    batching)
  export_format.write_batching_parameters(export_dir, module.max_batch_size)
  return path
