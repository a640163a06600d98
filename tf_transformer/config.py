"""The flags every tool shares, grouped by concern, and the frozen configs built from them.

Library code never reads FLAGS: the tools call `*_config_from_flags()` once and pass the configs
down. Every tool imports this module, so one flagfile (flags/) serves training, translation,
evaluation and export; a flag only one tool reads is defined with that tool
(tf_transformer/bin). It imports no TensorFlow.
"""

import dataclasses
import math

from absl import flags

from common.errors import UserError

# ---------------------------------------------------------------- data
flags.DEFINE_string("data_dir", None, "Folder of the corpus files {prefix}.{lang}[.gz].")
flags.DEFINE_string("dataset", "",
                    "tfds:NAME[/CONFIG]: a TFDS translation dataset (public, e.g. "
                    "tfds:wmt14_translate/de-en, or built by build_dataset) "
                    "instead of "
                    "--data_dir; its train/validation/test splits are used.")
flags.DEFINE_string("tfds_data_dir", None, "Where TFDS datasets are stored (default: TFDS's).")
flags.DEFINE_string("src_lang", "en", "Source language suffix of the corpus files.")
flags.DEFINE_string("tgt_lang", "de", "Target language suffix of the corpus files.")
flags.DEFINE_string("train_prefix", "train", "Training corpus: {data_dir}/{train_prefix}.{lang}.")
flags.DEFINE_string("dev_prefix", "val", "Dev corpus (loss, BLEU, best checkpoint).")
flags.DEFINE_string("test_prefix", None, "Test corpus, scored once after training.")
flags.DEFINE_integer("max_length", 100, "Pairs with more subword tokens on a side are dropped.",
                     lower_bound=1)
flags.DEFINE_integer("vocab_size", 8000, "SentencePiece vocabulary size (per model).",
                     lower_bound=16)
flags.DEFINE_enum("spm_model_type", "unigram", ["unigram", "bpe"], "SentencePiece algorithm.")
flags.DEFINE_bool("shared_vocab", True,
                  "One joint vocabulary and one embedding matrix for source, target and "
                  "softmax; false: separate vocabularies, the target matrix still ties the softmax.")
flags.DEFINE_integer("spm_input_sentences", 2_000_000,
                     "At most this many sentences (sampled) train the SentencePiece model.",
                     lower_bound=1)
flags.DEFINE_enum("on_bad_line", "error", ["error", "skip"],
                  "A line that is not UTF-8: stop with its file:line, or skip the pair.")
flags.DEFINE_integer("batch_tokens", 4096, "Tokens per batch (per side, counting padding).",
                     lower_bound=1)
flags.DEFINE_integer("shuffle_buffer", 100_000, "Examples in the shuffle buffer.", lower_bound=1)

# ---------------------------------------------------------------- model
flags.DEFINE_integer("num_layers", 6, "Encoder and decoder layers (each).", lower_bound=1)
flags.DEFINE_integer("d_model", 512, "Model width.", lower_bound=1)
flags.DEFINE_integer("num_heads", 8, "Attention heads.", lower_bound=1)
flags.DEFINE_integer("d_ff", 2048, "Inner width of the feed-forward layers.", lower_bound=1)
flags.DEFINE_float("dropout_rate", 0.1, "Residual and embedding dropout.")
flags.DEFINE_float("attention_dropout_rate", 0.1, "Dropout on attention weights.")
flags.DEFINE_float("relu_dropout_rate", 0.1, "Dropout after the feed-forward ReLU.")
flags.DEFINE_enum("norm_position", "post", ["post", "pre"],  # layers.residual.NORM_POSITIONS
                  "post: the paper's LayerNorm(x + F(x)); pre: x + F(LayerNorm(x)).")
flags.DEFINE_bool("skip_padding", True,
                  "Run the layers on the real tokens only (padding stays out of every matmul, "
                  "norm and dropout except attention's core); off, every padded position is "
                  "computed too and shapes are static.")

# ---------------------------------------------------------------- training
flags.DEFINE_string("model_dir", None, "Checkpoints, vocabulary, TensorBoard logs.")
flags.DEFINE_integer("train_steps", 100_000, "Optimizer steps in total (resumes count).",
                     lower_bound=1)
flags.DEFINE_integer("warmup_steps", 4000, "Noam schedule warm-up steps.", lower_bound=1)
flags.DEFINE_float("learning_rate", 1.0, "Multiplier of the Noam schedule (its peak is "
                   "learning_rate * (d_model * warmup_steps)^-0.5).")
flags.DEFINE_float("label_smoothing", 0.1, "Label smoothing epsilon.")
flags.DEFINE_float("clip_norm", 0.0, "Clip gradients to this global norm (0: off).")
flags.DEFINE_integer("eval_every", 1000, "Steps between dev evaluations.", lower_bound=1)
flags.DEFINE_integer("save_every", 1000, "Steps between checkpoints.", lower_bound=1)
flags.DEFINE_integer("keep_checkpoints", 5, "Recent checkpoints kept (the best is kept apart).",
                     lower_bound=1)
flags.DEFINE_integer("eval_sentences", 1000, "Dev sentences decoded for BLEU (0: all).",
                     lower_bound=0)
flags.DEFINE_integer("eval_batch_size", 64, "Sentences per decoding batch.", lower_bound=1)
flags.DEFINE_integer("extra_decode_length", 50,
                     "Decoding stops at source length + this many tokens.", lower_bound=1)
flags.DEFINE_integer("eval_beam_size", 4, "Beam size of the dev BLEU (1: greedy).", lower_bound=1)
flags.DEFINE_integer("early_stopping", 0,
                     "Stop after this many evaluations without a better dev BLEU (0: off).",
                     lower_bound=0)
flags.DEFINE_integer("seed", 1234, "Seed of initialisation, dropout and data order.",
                     lower_bound=0, upper_bound=2**32 - 1)
flags.DEFINE_bool("deterministic", False,
                  "Enable TF op determinism (bit-exact reruns and resumes; slower).")
flags.DEFINE_enum("distribution", "default", ["default", "mirrored", "multi_worker", "tpu"],
                  "default: one device; mirrored: MirroredStrategy over all GPUs, or over "
                  "--num_cpu_devices logical CPUs when there is no GPU; multi_worker: "
                  "MultiWorkerMirroredStrategy across the hosts of TF_CONFIG; tpu: TPUStrategy "
                  "on --tpu.")
flags.DEFINE_integer("num_cpu_devices", 1, "Split the CPU into this many logical devices.",
                     lower_bound=1)
flags.DEFINE_string("tpu", "", "TPU name or grpc:// address (--distribution=tpu; '' = local).")
flags.DEFINE_enum("on_nonfinite", "stop", ["stop", "skip"],
                  "A step whose loss or gradients are NaN/Inf applies no update; then stop: end "
                  "the run, naming the step and the last good checkpoint; skip: go on, and stop "
                  "after --max_nonfinite_steps such steps in a row.")
flags.DEFINE_integer("max_nonfinite_steps", 10,
                     "With --on_nonfinite=skip, stop after this many non-finite steps in a row.",
                     lower_bound=1)
flags.DEFINE_integer("update_freq", 1,
                     "Accumulate the gradients of this many batches per optimizer update "
                     "(an N times larger effective batch).", lower_bound=1)
flags.DEFINE_enum("mixed_precision", "auto",
                  ["auto", "float32", "mixed_float16", "mixed_bfloat16"],
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
flags.DEFINE_integer("average_last", 3,
                     "At the end of training, the average of this many newest checkpoints "
                     "competes on dev BLEU with the best checkpoint and the moving average for "
                     "the run's final weights (--checkpoint=final); 0 or 1: no average.",
                     lower_bound=0)
flags.DEFINE_bool("jit_compile", False,
                  "XLA-compile the train step (static shapes: one compilation per length "
                  "bucket; needs --noskip_padding: real-token rows have data-dependent shapes).")

# ---------------------------------------------------------------- decoding and inference
flags.DEFINE_integer("beam_size", 4, "Beam size of translation and export (1: greedy).",
                     lower_bound=1)
flags.DEFINE_float("alpha", 0.6, "GNMT length-penalty exponent ((5 + length) / 6)^alpha.")
flags.DEFINE_integer("nbest", 1, "Hypotheses printed per sentence by translate (<= beam_size).",
                     lower_bound=1)
flags.DEFINE_bool("decode_jit", False,
                  "XLA-compile the search (batches padded to shape buckets, each compiled once "
                  "in a few seconds; 2.5-3x faster one sentence at a time, ~1.1-1.3x in batches "
                  "of 32). Default true for export_saved_model, false elsewhere.")
flags.DEFINE_string("saved_model", None,
                    "Translate with this exported SavedModel version folder (translate, "
                    "evaluate).")
flags.DEFINE_string("output", None, "Where translate's translations go (default: stdout), or "
                    "evaluate's hypotheses (default: hypotheses.txt).")
flags.DEFINE_integer("batch_size", 32, "Sentences per decoding batch.", lower_bound=1)
flags.DEFINE_string("checkpoint", "final",
                    "The checkpoint of --model_dir that translate, evaluate and the exports load: "
                    "final (the weights the run chose by dev BLEU at its end among best, "
                    "average and ema; else best), "
                    "best (by dev BLEU; else the latest), latest, average (written by "
                    "average_checkpoints), ema (the moving average of a run with --ema_decay, as "
                    "of its latest checkpoint) or a checkpoint path such as models/x/ckpt-2000.")

FLAGS = flags.FLAGS


def _in_unit_interval(value) -> bool:
  return 0.0 <= value < 1.0


def _finite_and(check):
  return lambda value: math.isfinite(value) and check(value)


# The real-valued flags' domains, checked when the flags are parsed, before anything is built
# (the integer flags carry theirs as bounds): "error: flag --NAME=VALUE: must be ...".
_DOMAINS = {
    "dropout_rate": (_in_unit_interval, "in [0, 1)"),
    "attention_dropout_rate": (_in_unit_interval, "in [0, 1)"),
    "relu_dropout_rate": (_in_unit_interval, "in [0, 1)"),
    "label_smoothing": (_in_unit_interval, "in [0, 1)"),
    "ema_decay": (_in_unit_interval, "in [0, 1) (0: no moving average)"),
    "learning_rate": (_finite_and(lambda value: value > 0.0), "a finite number > 0"),
    "clip_norm": (_finite_and(lambda value: value >= 0.0), "a finite number >= 0 (0: off)"),
    "alpha": (_finite_and(lambda value: value >= 0.0), "a finite number >= 0"),
}
for _name, (_check, _domain) in _DOMAINS.items():
  flags.register_validator(_name, _check, message=f"must be {_domain}")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the corpora are and how they become batches."""
  data_dir: str | None = None
  dataset: str = ""
  tfds_data_dir: str | None = None
  src_lang: str = "en"
  tgt_lang: str = "de"
  train_prefix: str = "train"
  dev_prefix: str | None = "val"
  test_prefix: str | None = None
  max_length: int = 100
  vocab_size: int = 8000
  spm_model_type: str = "unigram"
  shared_vocab: bool = True
  spm_input_sentences: int = 2_000_000
  on_bad_line: str = "error"
  batch_tokens: int = 4096
  shuffle_buffer: int = 100_000


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture; the field names are the Transformer's constructor arguments."""
  source_vocab_size: int
  target_vocab_size: int
  shared_vocab: bool = True
  num_layers: int = 6
  d_model: int = 512
  num_heads: int = 8
  d_ff: int = 2048
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  relu_dropout_rate: float = 0.1
  norm_position: str = "post"
  skip_padding: bool = True


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The optimisation loop, evaluation and checkpointing."""
  model_dir: str
  train_steps: int = 100_000
  warmup_steps: int = 4000
  learning_rate: float = 1.0
  label_smoothing: float = 0.1
  clip_norm: float = 0.0
  eval_every: int = 1000
  save_every: int = 1000
  keep_checkpoints: int = 5
  eval_sentences: int = 1000
  eval_batch_size: int = 64
  eval_beam_size: int = 4
  early_stopping: int = 0
  seed: int = 1234
  deterministic: bool = False
  distribution: str = "default"
  num_cpu_devices: int = 1
  tpu: str = ""
  on_nonfinite: str = "stop"
  max_nonfinite_steps: int = 10
  update_freq: int = 1
  mixed_precision: str = "float32"
  jit_compile: bool = False
  ema_decay: float = 0.0
  average_last: int = 3
  profile_steps: tuple[int, int] | tuple[()] = ()


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """The search used by translation and fixed in an export."""
  beam_size: int = 4
  alpha: float = 0.6
  nbest: int = 1
  max_length: int = 100
  extra_decode_length: int = 50
  decode_jit: bool = False


class FlagError(UserError, ValueError):
  """A flag is missing or out of range; the message names it."""


def _require(condition: bool, message: str):
  if not condition:
    raise FlagError(message)


def _from_flags(config_class, **values):
  """A `config_class` whose fields missing from `values` take the flags of the same name."""
  names = [f.name for f in dataclasses.fields(config_class) if f.name not in values]
  return config_class(**{name: FLAGS[name].value for name in names}, **values)


def data_config_from_flags() -> DataConfig:
  _require(FLAGS.data_dir or FLAGS.dataset,
           "--data_dir is required (the folder of the corpus files), or --dataset=tfds:NAME")
  _require(not FLAGS.dataset or FLAGS.dataset.startswith("tfds:"),
           f"--dataset must look like tfds:NAME or tfds:NAME/CONFIG, got {FLAGS.dataset!r}")
  _require(FLAGS.batch_tokens > FLAGS.max_length,
           f"--batch_tokens ({FLAGS.batch_tokens}) must exceed --max_length ({FLAGS.max_length})")
  return _from_flags(DataConfig)


def model_config_from_flags(source_vocab_size: int, target_vocab_size: int) -> ModelConfig:
  _require(FLAGS.d_model % FLAGS.num_heads == 0,
           f"--d_model ({FLAGS.d_model}) must be divisible by --num_heads ({FLAGS.num_heads})")
  _require(FLAGS.d_model % 2 == 0, f"--d_model must be even, got {FLAGS.d_model}")
  return _from_flags(ModelConfig, source_vocab_size=source_vocab_size,
                     target_vocab_size=target_vocab_size)


def train_config_from_flags() -> TrainConfig:
  _require(FLAGS.model_dir, "--model_dir is required (checkpoints and logs go there)")
  static_shapes = FLAGS.jit_compile or FLAGS.distribution == "tpu"
  _require(not (static_shapes and FLAGS.skip_padding),
           "--jit_compile and --distribution=tpu need --noskip_padding (the rows of the real "
           "tokens have a data-dependent shape that XLA cannot compile)")
  return _from_flags(TrainConfig, profile_steps=_profile_steps(FLAGS.profile_steps))


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


def decode_config_from_flags() -> DecodeConfig:
  _require(1 <= FLAGS.nbest <= FLAGS.beam_size,
           f"--nbest must be between 1 and --beam_size ({FLAGS.beam_size}), got {FLAGS.nbest}")
  return _from_flags(DecodeConfig)
