"""String-to-string translation: a tf.Module whose functions tokenize, search and detokenize
in-graph (the SavedModel's signatures).

The module holds the model's variables and the tf-text SentencePiece tokenizers, not the Keras
model object: saving a tf.Module that holds a Keras 3 model fails while tracing the model's call,
while traced functions that close over the model and capture its variables save and load with
nothing but tensorflow and tensorflow_text.
"""

import dataclasses
import functools
import uuid
from typing import NamedTuple

import tensorflow as tf

from data_pipeline.token_ids import EOS_ID, PAD_ID, UNK_ID
from tf_transformer import decoding
from tf_transformer.decoding import ensemble
from tf_transformer.decoding import lexical_constraints
from tf_transformer.decoding import shortlist as shortlist_lib
from tf_transformer.decoding import strategies
from tf_transformer.config import BatchingConfig, DecodeConfig
from tf_transformer.layers import precisions

_STRINGS = tf.TensorSpec([None], tf.string)
_SEEDS = tf.TensorSpec([None], tf.int64)
_WIDTH_BUCKET = 16
# The compiled constrained search has two widths: this many pieces (most terms fit) and
# max_constraint_tokens; each candidate a step costs K x width more (see translating.md)
NARROW_CONSTRAINTS = 8
# A subword piece is at most 16 characters (SentencePiece's max_sentencepiece_length) of at most
# 4 bytes, with white space around it: the bytes of a text that its first pieces can come from.
_BYTES_PER_PIECE = 128
# The signatures' functions: plain TensorFlow ops, no AutoGraph (converting this module's code
# took half of each signature's tracing, and an export traces nine)
_signature = functools.partial(tf.function, autograph=False)


def _rows(strings):
  """`strings` checked at run time to be [B]: a SavedModel signature does not check the
  shape it declares, and a scalar or a matrix would otherwise fail deep inside the search.
  The error reads "Shape of tensor inputs [] is not compatible with expected shape [?]"."""
  return tf.ensure_shape(strings, [None])


def _same_rows(signature: str, inputs, other, name: str):
  """An assertion that `other` has as many rows as `inputs`."""
  return tf.debugging.assert_equal(
      tf.size(inputs), tf.size(other),
      message=f"{signature}: inputs and {name} must have the same number of rows")


def _bucket_rows(batch):
  """int32 scalar: the rows of a batch of `batch` (int32 scalar) sentences in its XLA shape
  bucket, the smallest power of two >= batch."""
  rows = batch - 1  # integer arithmetic only, which XLA folds into a constant at compile time
  for shift in (1, 2, 4, 8, 16):
    rows = tf.bitwise.bitwise_or(rows, tf.bitwise.right_shift(rows, shift))
  return rows + 1


def _bucket_width(width):
  """int32 scalar: the width of a batch of `width` (a Python int or an int32 scalar) pieces in
  its XLA shape bucket, the next multiple of _WIDTH_BUCKET; _WIDTH_BUCKET for 0 (an empty
  prefix runs the search of a short one)."""
  return -(-tf.maximum(width, 1) // _WIDTH_BUCKET) * _WIDTH_BUCKET


def _shape_forgotten(tensor):
  """`tensor` as it is, its static shape [None, ...] of its rank: what the graph of a caller
  knows of it (a padding's constant width, say) then makes no trace of its own."""
  return tf.raw_ops.PlaceholderWithDefault(input=tensor, shape=[None] * tensor.shape.rank)


def _word_inside(tokenizer, vocab_size: int):
  """bool [vocab_size]: the subword pieces that start with a letter or a digit and no word
  boundary ("▁"), which go on with the word before them (lexical_constraints.Constraints)."""
  pieces = tokenizer.id_to_string(tf.range(vocab_size)).numpy()
  return [piece.decode("utf-8")[:1].isalnum() for piece in pieces]


def _with_copies_of_first_row(tensor, extra_rows):
  """tensor [B, ...] with `extra_rows` copies of its first row below."""
  copies = tf.tile(tensor[:1], tf.concat([[extra_rows], tf.ones([tensor.shape.rank - 1],
                                                                 tf.int32)], axis=0))
  return tf.concat([tensor, copies], axis=0)


def _padded_to(tensor, sizes):
  """tensor [B, ...] with each dimension after the first padded (0, False) to its size in
  `sizes` (int32 [rank - 1])."""
  padding = tf.stack([tf.zeros_like(sizes), sizes - tf.shape(tensor)[1:]], axis=1)
  return tf.pad(tensor, tf.concat([[[0, 0]], padding], axis=0))


def _constraint_width(constraints, size: int):
  """int32 scalar: the width of the XLA-compiled search's constraint tensors (tokens [B, w],
  banned [B, w, w]) for `constraints` of any widths: NARROW_CONSTRAINTS when their positive
  pieces, phrases to avoid and pieces of one all fit in it, else `size` (the export's
  max_constraint_tokens, which no valid request exceeds). Two widths: the warm-up requests
  compile the narrow one, a request of wider constraints the wide one (export/serving.py
  `_warmup_batches`)."""
  widest = tf.reduce_max(tf.concat([tf.shape(constraints.tokens)[1:],
                                    tf.shape(constraints.banned)[1:]], axis=0))
  return tf.where(widest <= NARROW_CONSTRAINTS, min(NARROW_CONSTRAINTS, size), size)


def _trimmed(constraints, word_inside):
  """lexical_constraints.Constraints padded to any widths -> the same constraints cut to the
  widths of their longest row (padding costs every step of the search), with `word_inside`."""
  def longest(counts):  # (0 for no row)
    return tf.reduce_max(tf.concat([tf.reshape(counts, [-1]), [0]], axis=0))

  def count(mask, axis):
    return tf.reduce_sum(tf.cast(mask, tf.int32), axis=axis)

  tokens, continues, banned = constraints[:3]
  width = longest(count(tokens > 0, axis=1))
  phrase_lengths = count(banned > 0, axis=2)  # -> [B, N]
  return lexical_constraints.Constraints(
      tokens[:, :width], continues[:, :width],
      banned[:, :longest(count(phrase_lengths > 0, axis=1)), :longest(phrase_lengths)],
      word_inside)


class _ConstraintPieces(NamedTuple):
  """The phrases of constraint lines (Translator._constraint_pieces): `positive` and `negative`,
  int32 ragged [B, (phrases), (pieces)], the target pieces of those to include and of those to
  avoid; `empty` and `too_long`, bool ragged [B, (n)], the empty phrases and those of more
  bytes than max_constraint_tokens pieces; `too_many`, bool [B], lines of more than
  2 x max_constraint_tokens phrases (read up to there)."""
  positive: tf.RaggedTensor
  negative: tf.RaggedTensor
  empty: tf.RaggedTensor
  too_long: tf.RaggedTensor
  too_many: tf.Tensor


class _Untracked:
  """Holds `value` where tf.Module's tracking does not look (a plain object is not tracked)."""

  def __init__(self, value):
    self.value = value


class Translator(tf.Module):
  """Signatures `serving_default`, `translate_nbest`, `translate_prefix`, `score` and `align`
  (beam search), and `sample` and `sample_prefix` (random sampling), over a Transformer.

  Args:
    model: the Transformer, or an ensemble.Ensemble of them decoded as one (their variables
      are tracked, the objects are not).
    vocabulary: data_pipeline.tokenizer.Vocabulary with the source/target tokenizers.
    config: config.DecodeConfig, fixed here: the beam signatures search with its beam_size and
      alpha and return its nbest best; the sampling signatures draw with its sampling_topk,
      sampling_topp, sampling_temperature (and alpha for their scores); its strategy and seed
      are not used here (the caller picks the signature, the sampling ones take a seed per
      row). Inputs are cut to max_source_length subword pieces; outputs stop at source length +
      extra_decode_length pieces, or at max_decode_length. decode_jit XLA-compiles the searches
      (tokenization stays outside: XLA has no string ops); XLA compiles once per input shape,
      so batches are padded to shape buckets first.
    max_batch_size: larger requests to every signature are decoded (or scored) this many
      sentences at a time, so that a request's memory is bounded whatever its size.
    precision: the weights of the matrix products, a name of precisions.PRECISIONS:
      a lower one converts `model` in place (precisions.convert), and the module then holds
      those copies instead of the float32 matrices they replace.
    shortlist_size: 0, or n >= 2: every search (not `score`) writes for each sentence only the
      n target ids that shortlist.select chooses for it from `lexicon` (the pieces of its
      forced prefix among them), normalising its probabilities over them, whatever the other
      sentences of its batch. n >= the target vocabulary's size: the whole vocabulary, as 0.
    lexicon: data_pipeline.lexical_shortlist.Lexicon (its table and priorities are saved with
      the module as variables); required with a shortlist.
    batching: config.BatchingConfig, or None: the signatures in BATCHED_SIGNATURES merge the
      requests of concurrent callers into one search (see `_batched`).
  """

  # The signatures whose concurrent requests batching merges. Not `align`: its outputs are
  # as wide as the longest input of the batch, so a merged batch would widen a caller's.
  BATCHED_SIGNATURES = ("serving_default", "translate_nbest", "translate_prefix", "sample",
                        "sample_prefix", "score", "translate_constrained",
                        "translate_constrained_prefix")
  # Of those, the signatures whose searches compile every XLA program of the others: the
  # others run the same searches (a forced prefix of the narrowest bucket runs the program of
  # none, see `_decode`) or none that is compiled (`score`)
  PROGRAM_SIGNATURES = ("serving_default", "sample", "translate_constrained")

  def __init__(self, model, vocabulary, config: DecodeConfig = DecodeConfig(), *,
               max_batch_size: int = 64, precision: str = "float32", shortlist_size: int = 0,
               lexicon=None, batching: BatchingConfig | None = None):
    super().__init__(name="translator")
    if shortlist_size < 0 or shortlist_size == 1:
      raise ValueError(f"shortlist_size must be 0 (none) or at least 2, got {shortlist_size}")
    if 0 < shortlist_size < model.target_vocab_size and lexicon is None:
      raise ValueError("a shortlist_size needs the lexicon to choose the shortlists from")
    added, replaced = [], set()
    members = {id(member): member for member, _ in ensemble.weighted_members(model)}
    for member in members.values():  # (a model ensembled with itself is converted once)
      new, old = precisions.convert(member, precision)
      added += new
      replaced |= {variable.path for variable in old}
    variables = {id(v): v for member in members.values() for v in member.variables}.values()
    self.model_variables = [v.value for v in variables if v.path not in replaced] + added
    self.precision = precision
    self.source_tokenizer = vocabulary.source
    self.target_tokenizer = vocabulary.target
    # out of tf.Module's tracking (a list is tracked): saved through it, every variable would
    # be saved a second time, and the float32 matrices a lower precision replaces with them
    self._model = _Untracked(model)
    self.config = _Untracked(config)
    self.nbest = min(config.nbest, config.beam_size)  # of the beam signatures
    self.max_source_length = config.max_source_length
    self.max_batch_size = max_batch_size
    self.batching = _Untracked(batching)
    # the batch queues' names, unique to this module: a process that loads two exports (two
    # versions of a model under TF Serving) must not merge the requests of one into the other
    self._batch_queue = f"tf_transformer_{uuid.uuid4().hex}"
    self._word_inside = tf.constant(_word_inside(vocabulary.target, model.target_vocab_size))
    self.shortlist_size = shortlist_size if shortlist_size < model.target_vocab_size else 0
    size, table, order = self.shortlist_size, None, None
    if size:  # saved with the module (tracked attributes), read by the search
      table = self.shortlist_table = tf.Variable(lexicon.table, trainable=False,
                                                 name="shortlist_table")
      order = self.shortlist_order = tf.Variable(lexicon.order, trainable=False,
                                                 name="shortlist_order")

    def search_ids(strategy, ids, prefix_ids=None, seeds=None, constraints=None):
      shortlist = None
      if size:  # each sentence's own, so that its batch changes nothing of its translation
        forced = [t for t in (prefix_ids, constraints and constraints.tokens) if t is not None]
        shortlist = shortlist_lib.select(table, order, ids, size,
                                         tf.concat(forced, axis=1) if forced else None)
      search = dataclasses.replace(config, strategy=strategy)
      return decoding.decode(model, ids, search, prefix_ids, shortlist, seeds, constraints)

    # no AutoGraph inside the search: it is plain TensorFlow ops (converting the model's code
    # made up much of a small run's start-up)
    # (untracked: a SavedModel serves the signatures, see `_trackable_children`)
    self._searches = _Untracked({
        strategy: tf.function(functools.partial(search_ids, strategy),
                              jit_compile=config.decode_jit, autograph=False)
        for strategy in strategies.STRATEGIES})

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    """What tf.saved_model.save keeps of this module: its variables, tokenizers and tables,
    not its tf.functions. The SavedModel serves the concrete functions of `signatures()`; the
    tf.functions themselves would be traced again under the save's variable policy (a third of
    an export's time at small dims) to give the loaded object methods no caller uses."""
    if save_type != "savedmodel":  # (trackable.constants.SaveType is a str enum)
      return super()._trackable_children(save_type, **kwargs)
    return {name: child for name, child in self._checkpoint_dependencies
            if not isinstance(child, (tf.types.experimental.PolymorphicFunction,
                                      tf.types.experimental.ConcreteFunction))}

  def _decode(self, source_ids, prefix_ids=None, seeds=None, strategy: str = "beam",
              constraints=None):
    """int32 [B, S] (optional forced prefixes int32 [B, P], int64 seeds [B] and
    lexical_constraints.Constraints, see decoding.decode) -> (ids int32 [B, N, L], scores
    float32 [B, N]), N the beam size (1 for sampling)."""
    search = self._searches.value[strategy]
    if not self.config.value.decode_jit:
      return search(source_ids, prefix_ids, seeds, constraints)
    batch = tf.shape(source_ids)[0]
    if prefix_ids is None:
      # a prefix that forces nothing: the searches with and without a prefix are then one XLA
      # program at each shape (compiled programs are what an export's load time and its
      # memory mappings grow with), at the cost of a test per step (search_ops.force_prefix)
      prefix_ids = tf.zeros([batch, 0], tf.int32)
    # shape buckets: the batch padded to a power of two with copies of its first sentence
    # (they end when it does, so the loop runs no longer), the widths to multiples of 16 (a
    # sentence's search stops at its own length limit, so neither changes its result), the
    # constraints to one of two widths (`_constraint_width`)
    padded_batch = _bucket_rows(batch)
    padded = [self._bucketed(ids, padded_batch - batch) for ids in (source_ids, prefix_ids)]
    if seeds is not None:
      seeds = tf.concat([seeds, tf.tile(seeds[:1], [padded_batch - batch])], axis=0)
    if constraints is not None:
      width = _constraint_width(constraints, self.config.value.max_constraint_tokens)
      # (each with its static shape forgotten, as the ids below)
      constraints = constraints._replace(**{
          name: _shape_forgotten(_padded_to(
              _with_copies_of_first_row(getattr(constraints, name), padded_batch - batch),
              tf.fill([rank - 1], width)))
          for name, rank in (("tokens", 2), ("continues", 2), ("banned", 3))})
    # a traced search per static shape its callers know: with those forgotten, one for all
    padded = [_shape_forgotten(ids) for ids in padded]
    ids, scores = search(*padded, seeds, constraints)
    return ids[:batch], scores[:batch]

  @staticmethod
  def _bucketed(ids, extra_rows):
    """ids int32 [B, W] with `extra_rows` copies of its first row below, PAD_ID-padded to its
    `_bucket_width`."""
    width = tf.shape(ids)[1]
    padded = tf.concat([ids, tf.tile(ids[:1], [extra_rows, 1])], axis=0)
    return tf.pad(padded, [[0, 0], [0, _bucket_width(width) - width]], constant_values=PAD_ID)

  def _pieces_of(self, tokenizer, texts):
    """string [B] -> ragged int32 [B, (<= max_source_length)]: the first max_source_length
    subword pieces of each text, tokenized from at most its first _BYTES_PER_PIECE *
    max_source_length bytes, so that
    a line of any size costs bounded memory (SentencePiece's lattice takes ~200 bytes a byte)."""
    heads = tf.strings.substr(texts, 0, _BYTES_PER_PIECE * self.max_source_length)
    return tokenizer.tokenize(heads)[:, :self.max_source_length]

  def _ids(self, tokenizer, texts):
    """string [B] -> int32 [B, L]: `_pieces_of` each text + EOS, PAD_ID-padded (L: the most
    pieces + 1). EOS is written into the padded tensor: a ragged concatenation would cost
    each signature's tracing a tenth of an export's time."""
    pieces = self._pieces_of(tokenizer, texts)
    ids = tf.pad(pieces.to_tensor(default_value=PAD_ID), [[0, 0], [0, 1]],
                 constant_values=PAD_ID)
    ends = tf.cast(pieces.row_lengths(), tf.int32)[:, None]
    return tf.where(tf.range(tf.shape(ids)[1])[None, :] == ends, EOS_ID, ids)

  def source_bucket(self, text: str) -> int:
    """The width at which a request of `text` alone runs the XLA-compiled searches: its ids +
    EOS, to its `_bucket_width`. Texts of the same bucket compile the same programs (a search
    with a prefix of the narrowest bucket runs the program of one without; `score` is not
    compiled)."""
    width = self._source_ids(tf.constant([text])).shape[1]
    return int(_bucket_width(int(width)))

  def _source_ids(self, texts):
    """string [B] -> int32 [B, S], truncated to max_source_length tokens before EOS."""
    return self._ids(self.source_tokenizer, texts)

  def _in_chunks(self, fn, outputs, *inputs):
    """fn over rows [i, i + max_batch_size) of `inputs` (tensors [B, ...] each), concatenated:
    a request of any size is decoded in bounded memory.

    Args:
      fn: fn(*inputs of [rows, ...]) -> tuple of tensors [rows, ...].
      outputs: (trailing shape, dtype) of each tensor fn returns; a dimension is an int, or an
        int32 scalar tensor that is the same for every chunk.
    """
    count = tf.shape(inputs[0])[0]
    arrays = tuple(tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False,
                                  element_shape=tf.TensorShape(
                                      [None] + [d if isinstance(d, int) else None
                                                for d in shape]))
                   for shape, dtype in outputs)
    chunks = (count + self.max_batch_size - 1) // self.max_batch_size

    def write_chunk(index, arrays):
      start = index * self.max_batch_size
      results = fn(*(tensor[start:start + self.max_batch_size] for tensor in inputs))
      return index + 1, tuple(array.write(index, result)
                              for array, result in zip(arrays, results))

    _, arrays = tf.while_loop(lambda index, _: index < chunks, write_chunk, (0, arrays))
    # (concat fails on an empty array whose element shape is not fully known)
    return tuple(tf.cond(count > 0, array.concat, lambda s=shape, d=dtype: tf.zeros([0, *s], d))
                 for array, (shape, dtype) in zip(arrays, outputs))

  def _search(self, texts, prefixes=None, constraints=None):
    """string [B] (their target prefixes, string [B], and lexical_constraints.Constraints
    [B, ...]) -> (string [B, nbest], float32 [B, nbest]) by beam search, max_batch_size rows at
    a time."""
    lexical = () if constraints is None else tuple(constraints[:3])

    def chunk(texts, *values):
      prefixes = values[0] if len(values) > len(lexical) else None
      constraints = (lexical_constraints.Constraints(*values[-3:]) if lexical else None)
      return self._search_chunk(self.nbest, "beam", texts, prefixes, constraints=constraints)

    optional = () if prefixes is None else (prefixes,)
    return self._in_chunks(chunk, [([self.nbest], tf.string), ([self.nbest], tf.float32)],
                           texts, *optional, *lexical)

  def _sample(self, texts, seeds, prefixes=None):
    """string [B], int64 seeds [B] (and target prefixes, string [B]) -> (string [B], float32
    [B]): one sample each, max_batch_size rows at a time."""
    inputs = (texts, seeds) if prefixes is None else (texts, seeds, prefixes)
    outputs, scores = self._in_chunks(
        lambda texts, seeds, prefixes=None: self._search_chunk(1, "sample", texts, prefixes,
                                                               seeds),
        [([1], tf.string), ([1], tf.float32)], *inputs)
    return outputs[:, 0], scores[:, 0]

  def _search_chunk(self, count: int, strategy: str, texts, prefixes=None, seeds=None,
                    constraints=None):
    """string [B] (target prefixes string [B], int64 seeds [B], lexical_constraints.Constraints
    [B, ...] padded to any widths) -> the `count` best outputs of the `strategy` search
    (string [B, count], float32 [B, count]); blank input -> "" with score 0."""
    prefix_ids = None
    if prefixes is not None:
      prefix_ids = self._pieces_of(self.target_tokenizer, prefixes).to_tensor(
          default_value=PAD_ID)
    if constraints is not None:
      constraints = _trimmed(constraints, self._word_inside)
    ids, scores = self._decode(self._source_ids(texts), prefix_ids, seeds, strategy,
                               constraints)
    ids, scores = ids[:, :count], scores[:, :count]
    batch, length = tf.shape(ids)[0], tf.shape(ids)[2]
    flat = decoding.strip_after_eos(tf.reshape(ids, [batch * count, length]))
    outputs = tf.reshape(self.target_tokenizer.detokenize(flat), [batch, count])
    blank = tf.equal(tf.strings.length(tf.strings.strip(texts)), 0)[:, tf.newaxis]
    return tf.where(blank, "", outputs), tf.where(blank, 0.0, scores)

  def _constraint_pieces(self, lines) -> "_ConstraintPieces":
    """string [B] -> `_ConstraintPieces` of each line's phrases.

    A line holds tab-separated phrases of target text; one that starts with "!" must not
    appear; "" holds none. A line is read up to its first 2 x max_constraint_tokens phrases,
    each up to its first `_constraint_bytes` bytes: more is refused (`_checked_constraints`), and
    the heads bound the memory of any line."""
    most = 2 * self.config.value.max_constraint_tokens
    # a line of more phrases is refused: its rest stays one string (a 1 MB line of tabs is not
    # a million strings)
    phrases = tf.strings.split(lines, "\t", maxsplit=most)  # -> [B, (n <= most + 1)]
    empty = tf.equal(tf.strings.length(phrases), 0) & (tf.strings.length(lines) > 0)[:, tf.newaxis]
    phrases = tf.ragged.boolean_mask(phrases, tf.strings.length(phrases) > 0)  # "" line: none
    too_many = phrases.row_lengths() > most
    phrases = phrases[:, :most]
    # bytes, not regular expressions: a phrase may be invalid UTF-8
    negative = tf.equal(tf.strings.substr(phrases, 0, 1), "!")
    start = tf.cast(negative.flat_values, tf.int32)
    texts = tf.strings.substr(phrases.flat_values, start,
                              tf.fill(tf.shape(start), self._constraint_bytes))
    pieces = self.target_tokenizer.tokenize(texts)  # -> [all phrases, (p)]
    nested = tf.RaggedTensor.from_row_splits(pieces, phrases.row_splits)  # -> [B, (n), (p)]
    too_long = phrases.with_flat_values(
        tf.strings.length(phrases.flat_values) > self._constraint_bytes)
    return _ConstraintPieces(tf.ragged.boolean_mask(nested, tf.logical_not(negative)),
                             tf.ragged.boolean_mask(nested, negative), empty, too_long,
                             too_many)

  @property
  def _constraint_bytes(self) -> int:
    """The most bytes of a phrase (see _BYTES_PER_PIECE)."""
    return _BYTES_PER_PIECE * self.config.value.max_constraint_tokens

  def _checked_constraints(self, inputs, lines, prefixes=None):
    """The constraints of each row, once each row's can be met: string [B] ->
    lexical_constraints.Constraints (tokens, continues [B, max_constraint_tokens], banned
    [B, max_constraint_tokens, max_constraint_tokens]; no word_inside), fixed widths so that
    concurrent requests' rows merge. Their ops run after assertions that fail the request
    with an InvalidArgumentError that reads "constraints: <the problem> in row] [<its index>]"
    (before batching, so that one bad request fails no other).

    The problems: an empty phrase; more than 2 x max_constraint_tokens phrases; a phrase of
    more bytes than max_constraint_tokens pieces can hold (_BYTES_PER_PIECE each); a phrase of
    no subword piece; a phrase to include with a character out of the target vocabulary (its
    output could not show it); more positive pieces (or negative phrases, or pieces of one)
    than max_constraint_tokens; positive pieces that do not fit the output's length limit after
    the prefix (a row with none to include is not checked: its prefix is cut at the limit).

    Args:
      inputs, lines: string [B], the sources and their constraints; prefixes: optional
        string [B], their forced prefixes.
    """
    pieces = self._constraint_pieces(lines)
    positive, negative = pieces.positive, pieces.negative
    prefix_ids = None
    if prefixes is not None:
      prefix_ids = self._pieces_of(self.target_tokenizer, prefixes).to_tensor(
          default_value=PAD_ID)
    config = self.config.value
    size = config.max_constraint_tokens
    limits, _ = decoding.output_limits(self._source_ids(inputs), config, prefix_ids)
    positive_count = tf.cast(tf.reduce_sum(positive.row_lengths(axis=2), axis=1), tf.int32)
    prefix_count = 0 if prefix_ids is None else decoding.lengths(prefix_ids)
    checks = [
        (tf.reduce_any(pieces.empty, axis=1), "an empty phrase"),
        (pieces.too_many, f"more than {2 * size} phrases"),
        (tf.reduce_any(pieces.too_long, axis=1),
         f"a phrase of more than {self._constraint_bytes} bytes"),
        (tf.reduce_any(tf.equal(positive.row_lengths(axis=2), 0), axis=1)
         | tf.reduce_any(tf.equal(negative.row_lengths(axis=2), 0), axis=1),
         "a phrase of no subword piece"),
        (tf.reduce_any(tf.equal(positive.merge_dims(1, 2), UNK_ID), axis=1),
         "a phrase to include with a character the target vocabulary lacks"),
        (positive_count > size,
         f"more subword pieces to include than max_constraint_tokens={size}"),
        (negative.row_lengths(axis=1) > size,
         f"more phrases to avoid than max_constraint_tokens={size}"),
        (tf.reduce_any(negative.row_lengths(axis=2) > size, axis=1),
         f"a phrase to avoid of more subword pieces than max_constraint_tokens={size}"),
        # (without pieces to include, a prefix past the limit is cut there, as translate_prefix
        # does: the export's own warm-up prefixes are long val sentences)
        ((positive_count > 0) & (positive_count + prefix_count + 1 > limits),
         "more subword pieces to include (with the prefix and the end of the sentence) than "
         "the length limit of the output"),
    ]
    # (a 0 after the rows: argmax fails on a request of no row)
    asserts = [tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [
        f"constraints: {problem} in row", tf.argmax(tf.concat([tf.cast(bad, tf.int32), [0]], 0))])
        for bad, problem in checks]
    with tf.control_dependencies(asserts):
      constraints = lexical_constraints.from_phrases(positive, negative)
      return constraints._replace(**{
          name: tf.ensure_shape(
              _padded_to(getattr(constraints, name), tf.fill([rank - 1], size)),
              [None] + [size] * (rank - 1))
          for name, rank in (("tokens", 2), ("continues", 2), ("banned", 3))})

  def _batched(self, signature: str, fn, *inputs):
    """fn(*inputs), with the inputs of concurrent calls merged when the module batches.

    Through TensorFlow's BatchFunction op, one queue per signature: the requests that arrive
    while the queue's batch is open are concatenated (in any order, up to
    batching.max_batch_size rows, padded up to an allowed batch size with copies of a row), fn
    runs once over them, and each caller gets back its own rows. A request of no rows, or of
    more rows than max_batch_size, runs alone, as without batching.

    Args:
      signature: the signature's name, which names its queue.
      fn: fn(*tensors [b] each) -> tuple of tensors [b, ...], row i of each output depending
        on row i of the inputs alone.
      inputs: tensors [B, ...] (strings, seeds, or constraints of fixed widths).
    """
    batching = self.batching.value
    if batching is None:
      return fn(*inputs)
    function = tf.function(fn, autograph=False).get_concrete_function(
        *(tf.TensorSpec([None, *tensor.shape[1:]], tensor.dtype) for tensor in inputs))

    def merged():
      outputs = tf.raw_ops.BatchFunction(
          in_tensors=list(inputs), captured_tensors=function.captured_inputs, f=function,
          Tout=[output.dtype for output in function.outputs],
          num_batch_threads=batching.num_batch_threads,
          max_batch_size=batching.max_batch_size,
          batch_timeout_micros=batching.batch_timeout_micros,
          allowed_batch_sizes=list(batching.allowed_batch_sizes),
          max_enqueued_batches=batching.max_enqueued_batches,
          shared_name=f"{self._batch_queue}_{signature}", enable_large_batch_splitting=True)
      # the op's outputs have no static shape: give back fn's (an export's beam size is read
      # off translate_nbest's)
      return tuple(tf.ensure_shape(output, spec.shape)
                   for output, spec in zip(outputs, function.outputs))

    rows = tf.size(inputs[0])
    # (a request of no rows has nothing to merge, and BatchFunction fails on one whose outputs
    # have more than one dimension)
    return tf.cond(tf.logical_and(rows > 0, rows <= batching.max_batch_size), merged,
                   lambda: tuple(function(*inputs)))

  def _best(self, texts):
    """string [B] -> (string [B], float32 [B]): the best output of the beam search."""
    outputs, scores = self._search(texts)
    return outputs[:, 0], scores[:, 0]

  @_signature(input_signature=[_STRINGS])
  def serve(self, inputs):
    """inputs: string [B] -> {"outputs": string [B], "scores": float32 [B]} (the best)."""
    outputs, scores = self._batched("serving_default", self._best, _rows(inputs))
    return {"outputs": outputs, "scores": scores}

  @_signature(input_signature=[_STRINGS])
  def translate_nbest(self, inputs):
    """inputs: string [B] -> {"outputs": string [B, nbest], "scores": float32 [B, nbest]}."""
    outputs, scores = self._batched("translate_nbest", self._search, _rows(inputs))
    return {"outputs": outputs, "scores": scores}

  @_signature(input_signature=[_STRINGS, _STRINGS])
  def translate_prefix(self, inputs, prefix):
    """Translations that begin with given target text (interactive translation, post-editing).

    inputs, prefix: string [B] -> {"outputs": string [B, nbest], "scores": float32 [B, nbest]}:
    each translation of inputs[i] starts with prefix[i]'s subword pieces (its first
    max_source_length), forced, and the search continues from there; an empty prefix forces
    nothing (the translation of `translate_nbest`). Scores are those of the whole output,
    prefix included.
    """
    inputs, prefix = _rows(inputs), _rows(prefix)
    with tf.control_dependencies([_same_rows("translate_prefix", inputs, prefix, "prefix")]):
      outputs, scores = self._batched("translate_prefix", self._search, inputs, prefix)
    return {"outputs": outputs, "scores": scores}

  @_signature(input_signature=[_STRINGS, _STRINGS])
  def translate_constrained(self, inputs, constraints):
    """Translations that contain given target phrases and avoid others (terminology).

    inputs, constraints: string [B] -> as `translate_nbest`. constraints[i] holds tab-separated
    phrases of target text: every output of inputs[i] contains each phrase (in any order) and
    none of those written with a leading "!"; "" constrains nothing. The phrases are matched as
    their subword pieces, so a phrase is found as a whole word or words (as a term base holds
    them), not inside a longer word. Scores are the model's, as `score` gives them. A request
    whose constraints cannot be met (`_checked_constraints`) fails with an InvalidArgumentError.
    """
    inputs, constraints = _rows(inputs), _rows(constraints)
    with tf.control_dependencies([_same_rows("translate_constrained", inputs, constraints,
                                             "constraints")]):
      lexical = self._checked_constraints(inputs, constraints)
      outputs, scores = self._batched("translate_constrained", self._constrained, inputs,
                                      *lexical[:3])
    return {"outputs": outputs, "scores": scores}

  @_signature(input_signature=[_STRINGS, _STRINGS, _STRINGS])
  def translate_constrained_prefix(self, inputs, constraints, prefix):
    """`translate_constrained` with each output starting with prefix[i] (see
    `translate_prefix`): string [B] each -> as `translate_nbest`."""
    inputs, constraints, prefix = _rows(inputs), _rows(constraints), _rows(prefix)
    name = "translate_constrained_prefix"
    with tf.control_dependencies([_same_rows(name, inputs, constraints, "constraints"),
                                  _same_rows(name, inputs, prefix, "prefix")]):
      lexical = self._checked_constraints(inputs, constraints, prefix)
      outputs, scores = self._batched(name, self._constrained, inputs, *lexical[:3], prefix)
    return {"outputs": outputs, "scores": scores}

  def _constrained(self, texts, tokens, continues, banned, prefixes=None):
    """`_search` under the constraints `_checked_constraints` gives (their three tensors)."""
    return self._search(texts, prefixes,
                        lexical_constraints.Constraints(tokens, continues, banned))

  @_signature(input_signature=[_STRINGS, _SEEDS])
  def sample(self, inputs, seed):
    """Random sampling (back-translation): one output per row, drawn from the model's
    distribution as the export's sampling settings filter it (strategies.RandomSampling).

    inputs: string [B], seed: int64 [B] -> {"outputs": string [B], "scores": float32 [B]}:
    a row's output depends on its text and seed alone (not on the batch it is in); rows with
    the same text and different seeds are independent samples. The scores are the model's
    log-probabilities of the outputs over the length penalty, as `score` gives them.
    """
    inputs, seed = _rows(inputs), _rows(seed)
    with tf.control_dependencies([_same_rows("sample", inputs, seed, "seed")]):
      outputs, scores = self._batched("sample", self._sample, inputs, seed)
    return {"outputs": outputs, "scores": scores}

  @_signature(input_signature=[_STRINGS, _STRINGS, _SEEDS])
  def sample_prefix(self, inputs, prefix, seed):
    """`sample` with each output starting with prefix[i]'s subword pieces, forced (see
    `translate_prefix`): string [B], string [B], int64 [B] -> as `sample`."""
    inputs, prefix, seed = _rows(inputs), _rows(prefix), _rows(seed)
    with tf.control_dependencies([_same_rows("sample_prefix", inputs, prefix, "prefix"),
                                  _same_rows("sample_prefix", inputs, seed, "seed")]):
      outputs, scores = self._batched("sample_prefix", self._sample, inputs, seed, prefix)
    return {"outputs": outputs, "scores": scores}

  @_signature(input_signature=[_STRINGS, _STRINGS])
  def score(self, source, target):
    """source, target: string [B] -> {"log_prob": float32 [B]}, with the export's alpha.

    Both sides are cut at max_source_length subword pieces (then </s>), as the searches cut their
    input: the memory of a request is bounded whatever a client sends, and one overlong pair
    fails no other pair of a batch TF Serving merged it into. A cut target's score is that of
    its first max_source_length pieces.

    Over the whole target vocabulary, even with a shortlist: a given target may hold any
    piece, and its log-probability is the model's (the searches' scores, normalised over
    their shortlist, are a little higher)."""
    source, target = _rows(source), _rows(target)
    with tf.control_dependencies([tf.debugging.assert_equal(
        tf.size(source), tf.size(target),
        message="score: source and target must have the same number of rows")]):
      return {"log_prob": self._batched("score", self._score, source, target)[0]}

  def _score(self, source, target):
    """source, target: string [B] -> (float32 [B],), max_batch_size rows at a time."""
    return self._in_chunks(self._score_chunk, [([], tf.float32)], source, target)

  def _score_chunk(self, source, target):
    """source, target: string [B] -> (float32 [B],)."""
    return (decoding.score(self._model.value, self._source_ids(source),
                           self._ids(self.target_tokenizer, target), self.config.value.alpha),)

  @_signature(input_signature=[_STRINGS])
  def align(self, inputs):
    """The best translation with its cross-attention weights (for alignments and plots).

    inputs: string [B] -> {"outputs": string [B]; "source_tokens": string [B, S], the subword
    pieces read (truncated input, then "</s>"), "" as padding; "target_tokens": string [B, T],
    the pieces written, "</s>" included, "" as padding; "attention": float32 [B, T, S], the
    last decoder layer's weights averaged over heads, each real target row summing to 1 over
    the real source tokens, zeros elsewhere (and for blank inputs)}. S is the request's
    longest input + 1, T = S + extra_decode_length (or max_decode_length); decoded
    max_batch_size rows at a time.
    """
    inputs = _rows(inputs)
    source_ids = self._source_ids(inputs)  # the request's width, which every chunk keeps
    width = tf.shape(source_ids)[1]
    length = self._output_width(width)
    outputs, target_ids, attention = self._in_chunks(
        self._align_chunk, [([], tf.string), ([length], tf.int32), ([length, width], tf.float32)],
        inputs, source_ids)
    return {"outputs": outputs,
            "source_tokens": self._pieces(self.source_tokenizer, source_ids),
            "target_tokens": self._pieces(self.target_tokenizer, target_ids),
            "attention": attention}

  def _output_width(self, source_width):
    """T: the width of the ids of a search of sources `source_width` wide."""
    config = self.config.value
    return config.max_decode_length or source_width + config.extra_decode_length

  def _align_chunk(self, inputs, source_ids):
    """string [B], int32 [B, S] -> (string [B], ids int32 [B, T], float32 [B, T, S]) as
    `align` returns them, T being S + extra_decode_length (or max_decode_length)."""
    length = self._output_width(tf.shape(source_ids)[1])
    best = self._decode(source_ids)[0][:, 0]
    # no sentence writes past its own limit, so the bucketed XLA search's extra width is PAD
    best = tf.pad(best[:, :length], [[0, 0], [0, length - tf.shape(best[:, :length])[1]]])
    attention = decoding.attention(self._model.value, source_ids, best)
    blank = tf.equal(tf.strings.length(tf.strings.strip(inputs)), 0)
    outputs = self.target_tokenizer.detokenize(decoding.strip_after_eos(best))
    return (tf.where(blank, "", outputs), best,
            tf.where(blank[:, tf.newaxis, tf.newaxis], 0.0, attention))

  @staticmethod
  def _pieces(tokenizer, ids):
    """int32 [B, L] -> string [B, L]: each id's subword piece, "" at PAD_ID."""
    return tf.where(tf.equal(ids, PAD_ID), "", tokenizer.id_to_string(ids))

  def signatures(self) -> dict:
    return {"serving_default": self.serve.get_concrete_function(),
            "translate_nbest": self.translate_nbest.get_concrete_function(),
            "translate_prefix": self.translate_prefix.get_concrete_function(),
            "translate_constrained": self.translate_constrained.get_concrete_function(),
            "translate_constrained_prefix":
                self.translate_constrained_prefix.get_concrete_function(),
            "sample": self.sample.get_concrete_function(),
            "sample_prefix": self.sample_prefix.get_concrete_function(),
            "score": self.score.get_concrete_function(),
            "align": self.align.get_concrete_function()}
