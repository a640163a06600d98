"""The flags every tool shares, grouped by concern, and the configs built from them.

Every tool imports this module, so one flagfile (flags/) serves training, translation,
evaluation and export; a flag only one tool reads is defined with that tool. Library code never
reads flags: a tool calls `*_config_from_flags()` once and passes the configs
(tf_transformer/config.py) down. The domains of the flags are the configs' fields' own.
"""

import dataclasses
import math

from absl import flags

from tf_transformer import config
from tf_transformer.bin.cli import FlagError

FLAGS = flags.FLAGS


def _integer(name: str, default, help_text: str):
  """An integer flag bounded by its field's range (config.INTEGER_RANGES)."""
  low, high = config.INTEGER_RANGES[name]
  flags.DEFINE_integer(name, default, help_text, lower_bound=low, upper_bound=high)


def _enum(name: str, default: str, help_text: str):
  """A string flag with its field's choices (config.CHOICES)."""
  flags.DEFINE_enum(name, default, list(config.CHOICES[name]), help_text)


# ---------------------------------------------------------------- data
flags.DEFINE_string("data_dir", None, "Folder of the corpus files {prefix}.{lang}[.gz].")
flags.DEFINE_string("dataset", "",
                    "tfds:NAME[/CONFIG]: a TFDS translation dataset (public, e.g. "
                    "tfds:wmt14_translate/de-en, or built by build_dataset) "
                    "instead of "
                    "--data_dir; its train/validation/test splits are used.")
flags.DEFINE_string("tfds_data_dir", None, "Where TFDS datasets are stored (default: TFDS's).")
flags.DEFINE_string("src_lang", "en", "Source language suffix of the corpus files.")
flags.DEFINE_string("tgt_lang", "de",
                    "Target language suffix of the corpus files. Training: several, "
                    "comma-separated (de,fr,cs), train one multilingual model whose sources "
                    "carry a target-language token; translating with it: the one to translate "
                    "into.")
flags.DEFINE_string("train_prefix", "train",
                    "Training corpus: {data_dir}/{train_prefix}.{lang} (with --dataset: a split); "
                    "several, comma-separated, are drawn from by --train_weights.")
flags.DEFINE_list("train_weights", [],
                  "With several --train_prefix corpora: each one's share of the training pairs "
                  "(numbers >= 0, any scale; each corpus repeats on its own). Default: in "
                  "proportion to their sizes, as if concatenated. With several --tgt_lang, one "
                  "per language and corpus, each language's corpora in turn.")
flags.DEFINE_string("dev_prefix", "val", "Dev corpus (loss, BLEU, best checkpoint).")
flags.DEFINE_string("test_prefix", None, "Test corpus, scored once after training.")
_integer("max_length", 100,
         "Training pairs with more subword tokens on a side are dropped; translation and "
         "scoring cut their inputs (and target prefixes) to this many.")
_integer("vocab_size", 8000, "SentencePiece vocabulary size (per model).")
_enum("spm_model_type", "unigram", "SentencePiece algorithm.")
flags.DEFINE_bool("spm_byte_fallback", False,
                  "SentencePiece byte fallback: a character outside the vocabulary becomes "
                  "its UTF-8 bytes (256 of the vocabulary's pieces) instead of <unk>, so that "
                  "rare characters are read and written instead of shown as \u2047.")
flags.DEFINE_bool("shared_vocab", True,
                  "One joint vocabulary and one embedding matrix for source, target and "
                  "softmax; false: separate vocabularies, the target matrix still ties the "
                  "softmax.")
_integer("spm_input_sentences", 2_000_000,
         "At most this many sentences (sampled) train the SentencePiece model.")
_enum("on_bad_line", "error",
      "A line that is not UTF-8: stop with its file:line, or skip the pair.")
_integer("batch_tokens", 4096, "Tokens per batch (per side, counting padding).")
_integer("shuffle_buffer", 100_000, "Examples in the shuffle buffer.")
flags.DEFINE_float("subword_alpha", 0.0,
                   "Subword regularization: > 0 samples a segmentation of each training "
                   "sentence each time it is read (SentencePiece's smoothing alpha: smaller is "
                   "noisier; over all segmentations 0.5 keeps the best for 2 sentences in 3, "
                   "0.1 nearly doubles the pieces; for a BPE model, the merge dropout). 0: the "
                   "one best, as dev and test.")
_integer("subword_nbest_size", -1,
         "With --subword_alpha: sample among this many best segmentations (-1: all).")
_enum("subword_sides", "both",
      "With --subword_alpha: the sides whose segmentations are sampled; the other keeps its "
      "one best.")
flags.DEFINE_float("source_token_dropout", 0.0,
                   "Source token dropout: each source subword piece of a training batch "
                   "becomes <unk> with this probability, drawn anew each time it is read "
                   "(Marian's --dropout-src on pieces). 0: off; dev, test and translation "
                   "never drop.")

# ---------------------------------------------------------------- model
_integer("num_layers", 6, "Encoder and decoder layers (each).")
_integer("d_model", 512, "Model width.")
_integer("num_heads", 8, "Attention heads.")
_integer("d_ff", 2048, "Inner width of the feed-forward layers.")
flags.DEFINE_float("dropout_rate", 0.1, "Residual and embedding dropout.")
flags.DEFINE_float("attention_dropout_rate", 0.1, "Dropout on attention weights.")
flags.DEFINE_float("relu_dropout_rate", 0.1, "Dropout after the feed-forward activation.")
_enum("norm_position", "post",  # layers.residual.NORM_POSITIONS
      "post: the paper's LayerNorm(x + F(x)); pre: x + F(LayerNorm(x)).")
_enum("position_encoding", "sinusoidal",
      "sinusoidal: the paper's absolute positions added to the embeddings; relative: Shaw et "
      "al. (2018), self-attention over key-query distances clipped to "
      "--max_relative_position, and no absolute position.")
_integer("max_relative_position", 0,
         "With --position_encoding=relative: the largest distance told apart (e.g. 16 or 20); "
         "farther keys share its representation.")
_enum("activation", "relu",  # layers.feed_forward.ACTIVATIONS
      "The feed-forward activation: relu (the paper's), swish (x * sigmoid(x), Marian's) or "
      "gelu.")
flags.DEFINE_bool("projection_biases", False,
                  "Biases on the attention's query, key, value and output projections (the "
                  "paper has none; Marian's and fairseq's models do).")
flags.DEFINE_float("layer_norm_epsilon", 1e-6, "Added to the variance in every layer norm.")
flags.DEFINE_bool("output_bias", False, "A learned bias of each vocabulary entry's logit.")
_enum("sinusoid_layout", "interleaved",  # layers.embedding.SINUSOID_LAYOUTS
      "Where the sinusoidal positions put their sines and cosines: interleaved (the paper's "
      "formula: sin, cos, sin, ...) or halves (the sines, then the cosines: Marian's, "
      "fairseq's).")
flags.DEFINE_bool("scale_embeddings", True,
                  "Multiply the embeddings by sqrt(--d_model) before the positions are added.")
flags.DEFINE_bool("skip_padding", True,
                  "Run the layers on the real tokens only (padding stays out of every matmul, "
                  "norm and dropout except attention's core); off, every padded position is "
                  "computed too and shapes are static.")

# ---------------------------------------------------------------- training
flags.DEFINE_string("model_dir", None, "Checkpoints, vocabulary, TensorBoard logs.")
_integer("train_steps", 100_000, "Optimizer steps in total (resumes count).")
flags.DEFINE_float("train_minutes", 0.0,
                   "Also stop once the training loop has run this many minutes, evaluations "
                   "and saves included, summed over resumes (fairseq's --stop-time-hours); the "
                   "final weights are then chosen and scored as after --train_steps. 0: off.")
_integer("warmup_steps", 4000, "Noam schedule warm-up steps.")
flags.DEFINE_float("learning_rate", 1.0, "Multiplier of the Noam schedule (its peak is "
                   "learning_rate * (d_model * warmup_steps)^-0.5).")
flags.DEFINE_float("label_smoothing", 0.1, "Label smoothing epsilon.")
flags.DEFINE_float("rdrop_alpha", 0.0,
                   "R-Drop (Liang et al., 2021): each batch passes twice through the model, "
                   "under dropout masks of its own, and this weight times the symmetric KL "
                   "divergence of the two passes' token distributions joins their "
                   "cross-entropies (a step costs about twice as much). 0: off.")
flags.DEFINE_float("clip_norm", 0.0, "Clip gradients to this global norm (0: off).")
_integer("eval_every", 1000, "Steps between dev evaluations.")
_integer("save_every", 1000, "Steps between checkpoints.")
_integer("keep_checkpoints", 5, "Recent checkpoints kept (the best is kept apart).")
_integer("eval_sentences", 1000, "Dev sentences decoded for BLEU (0: all).")
_integer("eval_batch_size", 64, "Sentences per decoding batch.")
_integer("extra_decode_length", 50,
         "Decoding stops at source length + this many tokens.")
_integer("min_decode_length", 0, "No output ends before this many tokens (</s> included).")
_integer("max_decode_length", 0,
         "Outputs stop at this many tokens (</s> included) instead of source length + "
         "--extra_decode_length (0).")
_integer("eval_beam_size", 4, "Beam size of the dev BLEU (1: greedy).")
_integer("early_stopping", 0,
         "Stop after this many evaluations without a better dev BLEU (0: off).")
_integer("seed", 1234, "Seed of initialisation, dropout and data order, and of the draws of "
         "--strategy=sample.")
flags.DEFINE_bool("deterministic", False,
                  "Enable TF op determinism (bit-exact reruns and resumes; slower).")
_enum("distribution", "default",
      "default: one device; mirrored: MirroredStrategy over all GPUs, or over "
      "--num_cpu_devices logical CPUs when there is no GPU; multi_worker: "
      "MultiWorkerMirroredStrategy across the hosts of TF_CONFIG; tpu: TPUStrategy "
      "on --tpu.")
_integer("num_cpu_devices", 1, "Split the CPU into this many logical devices.")
flags.DEFINE_string("tpu", "", "TPU name or grpc:// address (--distribution=tpu; '' = local).")
_enum("on_nonfinite", "stop",
      "A step whose loss or gradients are NaN/Inf applies no update; then stop: end "
      "the run, naming the step and the last good checkpoint; skip: go on, and stop "
      "after --max_nonfinite_steps such steps in a row.")
_integer("max_nonfinite_steps", 10,
         "With --on_nonfinite=skip, stop after this many non-finite steps in a row.")
_integer("update_freq", 1,
         "Accumulate the gradients of this many batches per optimizer update "
         "(an N times larger effective batch).")
_enum("mixed_precision", "auto",
      "Keras dtype policy of training: float32 variables, 16-bit compute; logits, "
      "softmax and loss stay float32; mixed_float16 adds dynamic loss scaling. auto: "
      "mixed_bfloat16 where the devices multiply bfloat16 in hardware (CPUs with "
      "AVX512-BF16 or AMX, GPUs of compute capability 8.0+, TPUs), else float32.")
flags.DEFINE_string("profile_steps", "",
                    "A,B: write a TensorFlow profile of training steps A to B (1-based, "
                    "inclusive) for TensorBoard's Profile tab; '' = none.")
flags.DEFINE_float("ema_decay", 0.0,
                   "Keep an exponential moving average of the weights with this decay (0: none; "
                   "0.999 averages over about the last 1000 steps); each checkpoint save also "
                   "writes it to model_dir/ema, which --checkpoint=ema loads.")
_integer("average_last", 3,
         "At the end of training, the average of this many newest checkpoints "
         "competes on dev BLEU with the best checkpoint and the moving average for "
         "the run's final weights (--checkpoint=final); 0 or 1: no average.")
flags.DEFINE_bool("jit_compile", False,
                  "XLA-compile the train step (static shapes: one compilation per length "
                  "bucket; needs --noskip_padding: real-token rows have data-dependent shapes).")

# ---------------------------------------------------------------- decoding and inference
_enum("strategy", "beam",
      "How translate and evaluate search: beam (--beam_size, 1: greedy) or sample (random "
      "sampling, as back-translation wants: --sampling_topk, --sampling_topp, "
      "--sampling_temperature, --seed; --nbest draws a source).")
_integer("beam_size", 4, "Beam size of translation and export (1: greedy).")
_integer("sampling_topk", 0,
         "With --strategy=sample: draw from the k most probable tokens (0: all).")
flags.DEFINE_float("sampling_topp", 1.0,
                   "With --strategy=sample: draw from the smallest set of the most probable "
                   "tokens whose probability reaches p (nucleus sampling; 1: all).")
flags.DEFINE_float("sampling_temperature", 1.0,
                   "With --strategy=sample: draw from softmax(logits / T) (0: the most "
                   "probable token).")
flags.DEFINE_float("alpha", 0.6, "GNMT length-penalty exponent ((5 + length) / 6)^alpha.")
_integer("no_repeat_ngram_size", 0,
         "No n-gram of target subword pieces twice in an output (0: off; 1: no piece twice); "
         "every strategy, fixed in an export.")
flags.DEFINE_float("repetition_penalty", 1.0,
                   "The logit of a target piece already written is divided by this if positive, "
                   "multiplied if negative (CTRL's rule, as CTranslate2's; 1: off, > 1 "
                   "discourages repeats); every strategy, fixed in an export.")
_integer("nbest", 1, "Hypotheses printed per sentence by translate (<= beam_size), or samples "
         "with --strategy=sample.")
_integer("max_constraint_tokens", 32,
         "The most subword pieces of a sentence's --constraints that must appear, and of each "
         "phrase that must not (and the most such phrases): a SavedModel's constrained "
         "searches are compiled for this many.")
flags.DEFINE_bool("decode_jit", False,
                  "XLA-compile the search (batches padded to shape buckets, each compiled once "
                  "in a few seconds; 2.5-3x faster one sentence at a time, ~1.1-1.3x in batches "
                  "of 32). Default true for export_saved_model, false elsewhere.")
flags.DEFINE_string("saved_model", None,
                    "Translate with this exported SavedModel version folder (translate, "
                    "evaluate).")
flags.DEFINE_string("output", None, "Where translate's translations go (default: stdout), or "
                    "evaluate's hypotheses (default: hypotheses.txt).")
_integer("batch_size", 32, "Sentences per decoding batch.")
flags.DEFINE_string("checkpoint", "final",
                    "The checkpoint of --model_dir that translate, evaluate and the exports load: "
                    "final (the weights the run chose by dev BLEU at its end among best, "
                    "average and ema; else best), "
                    "best (by dev BLEU; else the latest), latest, average (written by "
                    "average_checkpoints), ema (the moving average of a run with --ema_decay, as "
                    "of its latest checkpoint) or a checkpoint path such as models/x/ckpt-2000.")
flags.DEFINE_list("ensemble", [],
                  "Model directories (two or more, one vocabulary) that translate, evaluate and "
                  "export_saved_model decode as one model, their log-probabilities averaged at "
                  "each step; each at --checkpoint. Takes the place of --model_dir.")
flags.DEFINE_list("ensemble_weights", [],
                  "With --ensemble: a weight > 0 for each member (default: equal).")


# The real-valued flags' domains, checked when the flags are parsed, before anything is built
# (the integer flags carry theirs as bounds): "error: flag --NAME=VALUE: must be ...".
for _name, (_check, _domain) in config.REAL_DOMAINS.items():
  flags.register_validator(_name, _check, message=f"must be {_domain}")


def _require(condition: bool, message: str):
  if not condition:
    raise FlagError(message)


def _from_flags(config_class, **values):
  """A `config_class` whose fields missing from `values` take the flags of the same name."""
  names = [f.name for f in dataclasses.fields(config_class) if f.name not in values]
  return config_class(**{name: FLAGS[name].value for name in names}, **values)


def data_config_from_flags() -> config.DataConfig:
  _require(FLAGS.data_dir or FLAGS.dataset,
           "--data_dir is required (the folder of the corpus files), or --dataset=tfds:NAME")
  _require(not FLAGS.dataset or FLAGS.dataset.startswith("tfds:"),
           f"--dataset must look like tfds:NAME or tfds:NAME/CONFIG, got {FLAGS.dataset!r}")
  _require(FLAGS.batch_tokens > FLAGS.max_length,
           f"--batch_tokens ({FLAGS.batch_tokens}) must exceed --max_length ({FLAGS.max_length})")
  try:
    weights = tuple(float(weight) for weight in FLAGS.train_weights)
  except ValueError:
    weights = (math.nan,)
  languages = len(config.target_languages(FLAGS.tgt_lang))
  problem = config.train_weights_problem(
      weights, len(FLAGS.train_prefix.split(",")) * languages,
      prefix_name="--train_prefix" if languages == 1 else "--tgt_lang x --train_prefix")
  _require(not problem, f"--train_weights must be {problem}, got {','.join(FLAGS.train_weights)!r}")
  return _from_flags(config.DataConfig, train_weights=weights)


def model_config_from_flags(source_vocab_size: int, target_vocab_size: int) -> config.ModelConfig:
  _require(FLAGS.d_model % FLAGS.num_heads == 0,
           f"--d_model ({FLAGS.d_model}) must be divisible by --num_heads ({FLAGS.num_heads})")
  _require(FLAGS.d_model % 2 == 0, f"--d_model must be even, got {FLAGS.d_model}")
  return _from_flags(config.ModelConfig, source_vocab_size=source_vocab_size,
                     target_vocab_size=target_vocab_size)


def train_config_from_flags() -> config.TrainConfig:
  _require(FLAGS.model_dir, "--model_dir is required (checkpoints and logs go there)")
  static_shapes = FLAGS.jit_compile or FLAGS.distribution == "tpu"
  _require(not (static_shapes and FLAGS.skip_padding),
           "--jit_compile and --distribution=tpu need --noskip_padding (the rows of the real "
           "tokens have a data-dependent shape that XLA cannot compile)")
  _require(not (FLAGS.deterministic and FLAGS.subword_alpha > 0),
           "--deterministic cannot hold with --subword_alpha: SentencePiece samples with its own "
           "random generator, which TensorFlow cannot seed")
  return _from_flags(config.TrainConfig, profile_steps=_profile_steps(FLAGS.profile_steps))


def _profile_steps(value: str) -> tuple:
  """"A,B" -> (A, B); "" -> ()."""
  if not value:
    return ()
  try:
    first, last = (int(part) for part in value.split(","))
  except ValueError:
    first = last = 0
  _require(1 <= first <= last, f"--profile_steps must be A,B with 1 <= A <= B, got {value!r}")
  return first, last


def model_settings_from_flags() -> dict:
  """{ModelConfig field: its flag's value}, for the fields that have a flag."""
  return {field.name: FLAGS[field.name].value for field in dataclasses.fields(config.ModelConfig)
          if field.name in FLAGS}


_SAMPLING_FLAGS = ("sampling_topk", "sampling_topp", "sampling_temperature")


def decode_config_from_flags(for_export: bool = False) -> config.DecodeConfig:
  """The search the flags give. A sampling flag needs --strategy=sample, except in an export,
  whose `sample` signatures take it whatever --strategy says.

  Raises:
    FlagError: a sampling flag a beam search would ignore, or --nbest over --beam_size.
  """
  ignored = [f"--{name}={FLAGS[name].value:g}" for name in _SAMPLING_FLAGS
             if FLAGS[name].present]
  _require(for_export or FLAGS.strategy == "sample" or not ignored,
           f"{' and '.join(ignored)} {'needs' if len(ignored) == 1 else 'need'} "
           f"--strategy=sample (--strategy={FLAGS.strategy} does not sample)")
  _require(FLAGS.strategy == "sample" or FLAGS.nbest <= FLAGS.beam_size,
           f"--nbest must be between 1 and --beam_size ({FLAGS.beam_size}), got {FLAGS.nbest}")
  return _from_flags(config.DecodeConfig, max_source_length=FLAGS.max_length)


# The search flags an export compiles in, refused with --saved_model. (The length flags are
# fixed there too, but a flagfile shared with training sets them: they are ignored.)
_FIXED_AT_EXPORT = ("beam_size", "alpha", "sampling_topk", "sampling_topp",
                    "sampling_temperature", "no_repeat_ngram_size", "repetition_penalty")


def ensemble_from_flags() -> tuple[list[str], tuple[float, ...]]:
  """(--ensemble's directories, --ensemble_weights as numbers)."""
  try:
    weights = tuple(float(weight) for weight in FLAGS.ensemble_weights)
  except ValueError:
    weights = (0.0,)
  _require(all(weight > 0 for weight in weights) and (
      not weights or len(weights) == len(FLAGS.ensemble)),
           f"--ensemble_weights must be a number > 0 for each of the {len(FLAGS.ensemble)} "
           f"--ensemble directories, got {','.join(FLAGS.ensemble_weights)!r}")
  _require(not FLAGS.ensemble or len(FLAGS.ensemble) >= 2,
           f"--ensemble needs two or more model directories, got {len(FLAGS.ensemble)}")
  return list(FLAGS.ensemble), weights


def per_call_search() -> dict:
  """The search settings that translate and evaluate pass to each call (those a SavedModel
  lets a call choose: strategy and seed).

  Raises:
    FlagError: with --saved_model, a flag its export fixed was given.
  """
  given = [f"--{name}" for name in _FIXED_AT_EXPORT if FLAGS[name].present]
  _require(not (FLAGS.saved_model and given),
           f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} fixed in a SavedModel "
           "at export (its assets.extra/decoding.json has the values)")
  return {"strategy": FLAGS.strategy, "seed": FLAGS.seed}


def model_from_flags(decode_config):
  """The inference.TranslationModel of --saved_model, --model_dir or --ensemble (model
  directories, weighed by --ensemble_weights) at --checkpoint (if given; else the run's final
  weights); model directories search with `decode_config`, a SavedModel with its export's.

  Raises:
    FlagError: none or two of them given, or a checkpoint with a SavedModel.
    ModelDirError: an unusable folder.
  """
  from tf_transformer import loading

  members, weights = ensemble_from_flags()
  checkpoint = FLAGS.checkpoint if FLAGS["checkpoint"].present else None
  if members:
    _require(not FLAGS.saved_model,
             "give --ensemble (model directories) or --saved_model, not both")
    return loading.load_model_dir(members, FLAGS.src_lang, FLAGS.tgt_lang, decode_config,
                                  checkpoint, weights)
  _require(not weights, "--ensemble_weights weigh the members of --ensemble")
  _require(bool(FLAGS.saved_model) != bool(FLAGS.model_dir),
           "give exactly one of --saved_model and --model_dir")
  _require(not (FLAGS.saved_model and checkpoint is not None),
           "--checkpoint picks a checkpoint of --model_dir; a SavedModel holds its own weights")
  if FLAGS.model_dir:
    return loading.load_model_dir(FLAGS.model_dir, FLAGS.src_lang, FLAGS.tgt_lang,
                                  decode_config, checkpoint)
  return loading.load_saved_model(FLAGS.saved_model, FLAGS.tgt_lang)
