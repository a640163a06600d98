"""String-to-string translation: a tf.Module whose functions tokenize, search and detokenize
in-graph (the SavedModel's signatures).

The module holds the model's variables and the tf-text SentencePiece tokenizers, not the Keras
model object: saving a tf.Module that holds a Keras 3 model fails while tracing the model's call,
while traced functions that close over the model and capture its variables save and load with
nothing but tensorflow and tensorflow_text.
"""

import functools
import uuid

import tensorflow as tf

from data_pipeline.token_ids import PAD_ID
from tf_transformer import decoding
from tf_transformer.config import BatchingConfig, DecodeConfig
from tf_transformer.decoding import ensemble
from tf_transformer.layers import precisions
from tf_transformer.serving import (bounded_text, chunks, constraint_requests, request_batching,
                                    searches, xla_shapes)
from tf_transformer.serving.signatures import BY_NAME, CUT, SIGNATURES, chosen

def _rows(strings):
  """`strings` checked at run time to be [B]: a SavedModel signature does not check the
  shape it declares, and a scalar or a matrix would otherwise fail deep inside the search.
  The error reads "Shape of tensor inputs [] is not compatible with expected shape [?]"."""
  return tf.ensure_shape(strings, [None])


class _Untracked:
  """Holds `value` where tf.Module's tracking does not look (a plain object is not tracked)."""

  def __init__(self, value):
    self.value = value


class Translator(tf.Module):
  """The signatures of signatures.SIGNATURES (beam search, constrained beam search, random
  sampling, forced-decoding scores and alignments) over a Transformer, each a method.

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
    batching: config.BatchingConfig, or None: the batched signatures (signatures.BATCHED)
      merge the requests of concurrent callers into one search (request_batching.py).
  """

  def __init__(self, model, vocabulary, config: DecodeConfig = DecodeConfig(), *,
               max_batch_size: int = 64, precision: str = "float32", shortlist_size: int = 0,
               lexicon=None, batching: BatchingConfig | None = None):
    super().__init__(name="translator")
    if shortlist_size < 0 or shortlist_size == 1:
      raise ValueError(f"shortlist_size must be 0 (none) or at least 2, got {shortlist_size}")
    if 0 < shortlist_size < model.target_vocab_size and lexicon is None:
      raise ValueError("a shortlist_size needs the lexicon to choose the shortlists from")
    self.model_variables = precisions.inference_variables(
        [member for member, _ in ensemble.weighted_members(model)], precision)
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
    self._word_inside = tf.constant(constraint_requests.word_inside(vocabulary.target,
                                                                    model.target_vocab_size))
    self.shortlist_size = shortlist_size if shortlist_size < model.target_vocab_size else 0
    size, table, order = self.shortlist_size, None, None
    if size:  # saved with the module (tracked attributes), read by the search
      table = self.shortlist_table = tf.Variable(lexicon.table, trainable=False,
                                                 name="shortlist_table")
      order = self.shortlist_order = tf.Variable(lexicon.order, trainable=False,
                                                 name="shortlist_order")

    # (untracked: a SavedModel serves the signatures, see `_trackable_children`)
    self._searches = _Untracked(searches.Searches(model, config, size, table, order, batching,
                                                  max_batch_size))
    # the signatures' functions, each an attribute named by its method (`serve`,
    # `translate_nbest`, ...), over tensors named as the contract's inputs; plain TensorFlow
    # ops, no AutoGraph (converting this module's code took half of each signature's tracing)
    for signature in SIGNATURES:
      setattr(self, signature.method, tf.function(
          functools.partial(self._signature_function, signature), autograph=False,
          input_signature=signature.input_specs()))

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
    """searches.Searches.decode: int32 [B, S] ... -> (ids int32 [B, N, L], scores [B, N])."""
    return self._searches.value.decode(source_ids, prefix_ids, seeds, strategy, constraints)

  def _pieces_of(self, tokenizer, texts):
    """string [B] -> ragged int32 [B, (<= max_source_length)] (bounded_text.pieces)."""
    return bounded_text.pieces(tokenizer, texts, self.max_source_length)

  def _ids(self, tokenizer, texts):
    """string [B] -> int32 [B, L]: the pieces read + EOS, PAD_ID-padded (bounded_text.ids)."""
    return bounded_text.ids(tokenizer, texts, self.max_source_length)

  def source_bucket(self, text: str) -> int:
    """The width at which a request of `text` alone runs the XLA-compiled searches: its ids +
    EOS, to its bucket (with in-graph batching, to its width of the ladder). Texts of the same
    bucket compile the same programs (a search with a prefix of the narrowest bucket runs the
    program of one without; `score` is not compiled)."""
    width = int(xla_shapes.bucket_width(int(self._source_ids(tf.constant([text])).shape[1])))
    widths = self._searches.value.widths
    return width if widths is None else int(xla_shapes.ladder_width(width, widths))

  def ladder_texts(self, words: str) -> dict:
    """{text: its source_bucket}: a text of the first n words of `words` (repeated as needed)
    for each width of the batching ladder, the narrowest n; {} without the ladder."""
    widths, texts = self._searches.value.widths, {}
    words = words.split()
    for count in range(1, 2 * self.max_source_length + 1):
      text = " ".join(words[i % len(words)] for i in range(count))
      texts.setdefault(self.source_bucket(text), text)
      if widths is None or len(texts) == len(widths):
        break
    return {text: width for width, text in texts.items()} if widths else {}

  def _source_ids(self, texts):
    """string [B] -> int32 [B, S], truncated to max_source_length tokens before EOS."""
    return self._ids(self.source_tokenizer, texts)

  def _search(self, texts, prefixes=None, constraint_lines=None):
    """string [B] (their target prefixes, string [B], and constraint lines, string [B], that
    `_check_constraints` passed) -> (string [B, nbest], float32 [B, nbest]) by beam search,
    max_batch_size rows at a time."""

    def chunk(texts, *values):
      chunk_prefixes = values[0] if prefixes is not None else None
      lines = values[-1] if constraint_lines is not None else None
      return self._search_chunk(self.nbest, "beam", texts, chunk_prefixes,
                                constraint_lines=lines)

    optional = tuple(value for value in (prefixes, constraint_lines) if value is not None)
    return chunks.in_chunks(self.max_batch_size, chunk,
                            [([self.nbest], tf.string), ([self.nbest], tf.float32)],
                            texts, *optional)

  def _sample(self, texts, seeds, prefixes=None):
    """string [B], int64 seeds [B] (and target prefixes, string [B]) -> (string [B], float32
    [B]): one sample each, max_batch_size rows at a time."""
    inputs = (texts, seeds) if prefixes is None else (texts, seeds, prefixes)
    outputs, scores = chunks.in_chunks(
        self.max_batch_size,
        lambda texts, seeds, prefixes=None: self._search_chunk(1, "sample", texts, prefixes,
                                                               seeds),
        [([1], tf.string), ([1], tf.float32)], *inputs)
    return outputs[:, 0], scores[:, 0]

  def _search_chunk(self, count: int, strategy: str, texts, prefixes=None, seeds=None,
                    constraint_lines=None):
    """string [B] (target prefixes string [B], int64 seeds [B], constraint lines string [B]
    that `_check_constraints` passed) -> the `count` best outputs of the `strategy` search
    (string [B, count], float32 [B, count]); blank input -> "" with score 0."""
    prefix_ids = None
    if prefixes is not None:
      prefix_ids = self._pieces_of(self.target_tokenizer, prefixes).to_tensor(
          default_value=PAD_ID)
    constraints = None
    if constraint_lines is not None:
      constraints = constraint_requests.constraints_of(
          self._constraint_pieces(constraint_lines), self._word_inside)
    ids, scores = self._decode(self._source_ids(texts), prefix_ids, seeds, strategy,
                               constraints)
    ids, scores = ids[:, :count], scores[:, :count]
    batch, length = tf.shape(ids)[0], tf.shape(ids)[2]
    flat = decoding.strip_after_eos(tf.reshape(ids, [batch * count, length]))
    outputs = tf.reshape(self.target_tokenizer.detokenize(flat), [batch, count])
    blank = tf.equal(tf.strings.length(tf.strings.strip(texts)), 0)[:, tf.newaxis]
    return tf.where(blank, "", outputs), tf.where(blank, 0.0, scores)

  def _constraint_pieces(self, lines):
    """string [B] constraint lines -> constraint_requests.ConstraintPieces."""
    return constraint_requests.constraint_pieces(self.target_tokenizer, lines,
                                                 self.config.value.max_constraint_tokens)

  def _check_constraints(self, inputs, lines, prefixes=None):
    """Assertions (ops) that fail unless each row's constraints can be met
    (constraint_requests.checks): string [B] inputs and constraint lines (and their forced
    prefixes, string [B])."""
    prefix_ids = None
    if prefixes is not None:
      prefix_ids = self._pieces_of(self.target_tokenizer, prefixes).to_tensor(
          default_value=PAD_ID)
    limits, _ = decoding.output_limits(self._source_ids(inputs), self.config.value, prefix_ids)
    return constraint_requests.checks(self._constraint_pieces(lines), limits, prefix_ids,
                                      self.config.value.max_constraint_tokens)

  def _signature_function(self, signature, *inputs):
    """The function of `signature` (signatures.Signature), over its inputs (string or int64
    [B] each, in the contract's order): each checked to be [B], all of as many rows, then
    `_signature_<method>` of them, with its batched function (`request_batching.batched` in
    the signature's own queue, or a plain call for a signature that does not batch)."""
    inputs = [_rows(tensor) for tensor in inputs]
    first = signature.inputs[0].name
    checks = [tf.debugging.assert_equal(
        tf.size(inputs[0]), tf.size(other),
        message=f"{signature.name}: {first} and {tensor.name} must have the same number of rows")
        for other, tensor in zip(inputs[1:], signature.inputs[1:])]
    queue, batching = f"{self._batch_queue}_{signature.name}", self.batching.value
    if not signature.batched:
      batching = None
    batched = functools.partial(request_batching.batched, queue, batching)
    with tf.control_dependencies(checks):
      outputs = getattr(self, f"_signature_{signature.method}")(batched, *inputs)
    return {**outputs, CUT.name: self._cut(signature, inputs)}

  def _cut(self, signature, inputs):
    """bool [B]: the rows of which a text input of `signature` (inputs [B] each) was cut
    (bounded_text.cut)."""
    # a second tokenization, apart from the (maybe batched) search: 166 ms a 64-row beam either way
    cut = tf.zeros_like(inputs[0], tf.bool)
    for tensor, texts in zip(signature.inputs, inputs):
      if tensor.side:
        tokenizer = self.source_tokenizer if tensor.side == "source" else self.target_tokenizer
        cut |= bounded_text.cut(tokenizer, texts, self.max_source_length)
    return cut

  def _best(self, texts):
    """string [B] -> (string [B], float32 [B]): the best output of the beam search."""
    outputs, scores = self._search(texts)
    return outputs[:, 0], scores[:, 0]

  def _signature_serve(self, batched, inputs):
    """inputs: string [B] -> {"outputs": string [B], "scores": float32 [B]} (the best)."""
    outputs, scores = batched(self._best, inputs)
    return {"outputs": outputs, "scores": scores}

  def _signature_translate_nbest(self, batched, inputs):
    """inputs: string [B] -> {"outputs": string [B, nbest], "scores": float32 [B, nbest]}."""
    outputs, scores = batched(self._search, inputs)
    return {"outputs": outputs, "scores": scores}

  def _signature_translate_prefix(self, batched, inputs, prefix):
    """Translations that begin with given target text (interactive translation, post-editing).

    inputs, prefix: string [B] -> {"outputs": string [B, nbest], "scores": float32 [B, nbest]}:
    each translation of inputs[i] starts with prefix[i]'s subword pieces (its first
    max_source_length), forced, and the search continues from there; an empty prefix forces
    nothing (the translation of `translate_nbest`). Scores are those of the whole output,
    prefix included.
    """
    outputs, scores = batched(self._search, inputs, prefix)
    return {"outputs": outputs, "scores": scores}

  def _signature_translate_constrained(self, batched, inputs, constraints, prefix=None):
    """Translations that contain given target phrases and avoid others (terminology).

    inputs, constraints (and prefix): string [B] -> as `translate_nbest`. constraints[i] holds
    tab-separated phrases of target text: every output of inputs[i] contains each phrase (in
    any order) and none of those written with a leading "!"; "" constrains nothing. The phrases
    are matched as their subword pieces, so a phrase is found as a whole word or words (as a
    term base holds them), not inside a longer word. Scores are the model's, as `score` gives
    them. A request whose constraints cannot be met (constraint_requests.checks) fails with an
    InvalidArgumentError. With `prefix`, each output starts with prefix[i] (see
    `translate_prefix`).
    """
    with tf.control_dependencies(self._check_constraints(inputs, constraints, prefix)):
      inputs = tf.identity(inputs)
    optional = () if prefix is None else (prefix,)
    outputs, scores = batched(self._constrained, inputs, constraints, *optional)
    return {"outputs": outputs, "scores": scores}

  _signature_translate_constrained_prefix = _signature_translate_constrained

  def _constrained(self, texts, lines, prefixes=None):
    """`_search` under the constraint lines `_check_constraints` passed."""
    return self._search(texts, prefixes, lines)

  def _signature_sample(self, batched, inputs, seed):
    """Random sampling (back-translation): one output per row, drawn from the model's
    distribution as the export's sampling settings filter it (strategies.RandomSampling).

    inputs: string [B], seed: int64 [B] -> {"outputs": string [B], "scores": float32 [B]}:
    a row's output depends on its text and seed alone (not on the batch it is in); rows with
    the same text and different seeds are independent samples. The scores are the model's
    log-probabilities of the outputs over the length penalty, as `score` gives them.
    """
    outputs, scores = batched(self._sample, inputs, seed)
    return {"outputs": outputs, "scores": scores}

  def _signature_sample_prefix(self, batched, inputs, prefix, seed):
    """`sample` with each output starting with prefix[i]'s subword pieces, forced (see
    `translate_prefix`): string [B], string [B], int64 [B] -> as `sample`."""
    outputs, scores = batched(self._sample, inputs, seed, prefix)
    return {"outputs": outputs, "scores": scores}

  def _signature_score(self, batched, source, target):
    """source, target: string [B] -> {"log_prob": float32 [B]}, with the export's alpha.

    Both sides are cut at max_source_length subword pieces (then </s>), as the searches cut their
    input: the memory of a request is bounded whatever a client sends, and one overlong pair
    fails no other pair of a batch TF Serving merged it into. A cut target's score is that of
    its first max_source_length pieces.

    Over the whole target vocabulary, even with a shortlist: a given target may hold any
    piece, and its log-probability is the model's (the searches' scores, normalised over
    their shortlist, are a little higher)."""
    return {"log_prob": batched(self._score, source, target)[0]}

  def _score(self, source, target):
    """source, target: string [B] -> (float32 [B],), max_batch_size rows at a time."""
    return chunks.in_chunks(self.max_batch_size, self._score_chunk, [([], tf.float32)], source,
                            target)

  def _score_chunk(self, source, target):
    """source, target: string [B] -> (float32 [B],)."""
    return (decoding.score(self._model.value, self._source_ids(source),
                           self._ids(self.target_tokenizer, target), self.config.value.alpha),)

  def _signature_align(self, batched, inputs):
    """The best translation with its cross-attention weights (for alignments and plots).

    inputs: string [B] -> {"outputs": string [B]; "source_tokens": string [B, S], the subword
    pieces read (truncated input, then "</s>"), "" as padding; "target_tokens": string [B, T],
    the pieces written, "</s>" included, "" as padding; "attention": float32 [B, T, S], the
    last decoder layer's weights averaged over heads, each real target row summing to 1 over
    the real source tokens, zeros elsewhere (and for blank inputs)}. S is the request's
    longest input + 1, T = S + extra_decode_length (or max_decode_length); decoded
    max_batch_size rows at a time. Not batched: a merged batch would widen a caller's S.
    """
    del batched
    source_ids = self._source_ids(inputs)  # the request's width, which every chunk keeps
    width = tf.shape(source_ids)[1]
    length = self._output_width(width)
    outputs, target_ids, attention = chunks.in_chunks(
        self.max_batch_size, self._align_chunk, [([], tf.string), ([length], tf.int32), ([length, width], tf.float32)],
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

  def signatures(self, names=()) -> dict:
    """{name: concrete function} of the signatures `names` a SavedModel serves (empty: all)."""
    return {name: getattr(self, BY_NAME[name].method).get_concrete_function()
            for name in chosen(names)}
