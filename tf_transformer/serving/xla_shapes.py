"""The shape buckets of the XLA-compiled searches: XLA compiles one program per input shape, so
a batch is padded to a bucket first (rows to a power of two, widths to a multiple of 16,
constraints to one of two widths), and a sentence's result does not depend on the padding."""

import tensorflow as tf

from data_pipeline.token_ids import PAD_ID
from tf_transformer.decoding import lexical_constraints

WIDTH_BUCKET = 16
# The compiled constrained search has two widths: this many pieces (most terms fit) and
# max_constraint_tokens; each candidate a step costs K x width more (see translating.md)
NARROW_CONSTRAINTS = 8


def bucket_rows(batch):
  """int32 scalar: the rows of a batch of `batch` (int32 scalar) sentences in its XLA shape
  bucket, the smallest power of two >= batch."""
  rows = batch - 1  # integer arithmetic only, which XLA folds into a constant at compile time
  for shift in (1, 2, 4, 8, 16):
    rows = tf.bitwise.bitwise_or(rows, tf.bitwise.right_shift(rows, shift))
  return rows + 1


def bucket_width(width):
  """int32 scalar: the width of a batch of `width` (a Python int or an int32 scalar) pieces in
  its XLA shape bucket, the next multiple of WIDTH_BUCKET; WIDTH_BUCKET for 0 (an empty
  prefix runs the search of a short one)."""
  return -(-tf.maximum(width, 1) // WIDTH_BUCKET) * WIDTH_BUCKET


def width_ladder(max_length: int) -> tuple[int, ...]:
  """The widths an export with in-graph batching compiles its searches at: WIDTH_BUCKET,
  doubling, up to the widest bucket of ids of max_length pieces + EOS, which ends it (each
  width at most twice the one below, so a batch padded up to the next one costs at most twice
  its width)."""
  widest = int(bucket_width(max_length + 1))
  widths = [WIDTH_BUCKET]
  while widths[-1] * 2 < widest:
    widths.append(widths[-1] * 2)
  return tuple(widths + [widest] if widths[-1] < widest else widths)


def ladder_width(width, widths):
  """int32 scalar: the narrowest of `widths` (a width_ladder) >= `width` (the widest if none)."""
  ladder = tf.constant(widths, tf.int32)
  return tf.reduce_min(tf.where(ladder >= width, ladder, ladder[-1]))


def bucketed(ids, extra_rows, widths=None):
  """ids int32 [B, W] with `extra_rows` copies of its first row below, PAD_ID-padded to its
  `bucket_width`, or with `widths` (a width_ladder) to its `ladder_width`."""
  width = tf.shape(ids)[1]
  padded = tf.concat([ids, tf.tile(ids[:1], [extra_rows, 1])], axis=0)
  target = bucket_width(width) if widths is None else ladder_width(width, widths)
  return tf.pad(padded, [[0, 0], [0, target - width]], constant_values=PAD_ID)


def shape_forgotten(tensor):
  """`tensor` as it is, its static shape [None, ...] of its rank: what the graph of a caller
  knows of it (a padding's constant width, say) then makes no trace of its own."""
  return tf.raw_ops.PlaceholderWithDefault(input=tensor, shape=[None] * tensor.shape.rank)


def with_copies_of_first_row(tensor, extra_rows):
  """tensor [B, ...] with `extra_rows` copies of its first row below."""
  copies = tf.tile(tensor[:1], tf.concat([[extra_rows], tf.ones([tensor.shape.rank - 1],
                                                                 tf.int32)], axis=0))
  return tf.concat([tensor, copies], axis=0)


def padded_to(tensor, sizes):
  """tensor [B, ...] with each dimension after the first padded (0, False) to its size in
  `sizes` (int32 [rank - 1])."""
  padding = tf.stack([tf.zeros_like(sizes), sizes - tf.shape(tensor)[1:]], axis=1)
  return tf.pad(tensor, tf.concat([[[0, 0]], padding], axis=0))


def constraint_width(constraints, size: int):
  """int32 scalar: the width of the XLA-compiled search's constraint tensors (tokens [B, w],
  banned [B, w, w]) for `constraints` of any widths: NARROW_CONSTRAINTS when their positive
  pieces, phrases to avoid and pieces of one all fit in it, else `size` (the export's
  max_constraint_tokens, which no valid request exceeds). Two widths: the warm-up requests
  compile the narrow one, a request of wider constraints the wide one (warmup.py)."""
  widest = tf.reduce_max(tf.concat([tf.shape(constraints.tokens)[1:],
                                    tf.shape(constraints.banned)[1:]], axis=0))
  return tf.where(widest <= NARROW_CONSTRAINTS, min(NARROW_CONSTRAINTS, size), size)


def bucketed_constraints(constraints, extra_rows, size: int):
  """lexical_constraints.Constraints [B, ...] with `extra_rows` copies of the first row below,
  padded to `constraint_width` (`size`: max_constraint_tokens), static shapes forgotten."""
  width = constraint_width(constraints, size)
  return constraints._replace(**{
      name: shape_forgotten(padded_to(with_copies_of_first_row(getattr(constraints, name),
                                                               extra_rows),
                                      tf.fill([rank - 1], width)))
      for name, rank in lexical_constraints.PER_SENTENCE_RANKS.items()})


def compiled_rows(allowed_batch_sizes, chunk_rows: int) -> tuple[int, ...]:
  """The row buckets (`bucket_rows`) at which the searches of merged batches of each of
  `allowed_batch_sizes` rows run, `chunk_rows` (Translator.max_batch_size) at a time."""
  rows = set()
  for size in allowed_batch_sizes:
    whole, rest = divmod(size, chunk_rows)
    rows.update(1 << (chunk - 1).bit_length()
                for chunk in [chunk_rows] * whole + ([rest] if rest else []))
  return tuple(sorted(rows))


def at_compiled_shape(source_ids, prefix_ids, constraints, rows, size: int):
  """bool scalar: whether `bucketed_search` of these inputs on a width ladder runs at a shape
  an export with in-graph batching compiles at load (warmup.py): its rows bucket one of
  `rows`, a prefix (if any) of the narrowest bucket, constraints (if any) of the narrow width
  (`size`: max_constraint_tokens). Every source width is: the ladder's."""
  covered = tf.reduce_any(tf.equal(bucket_rows(tf.shape(source_ids)[0]), rows))
  if prefix_ids is not None:
    covered &= tf.equal(bucket_width(tf.shape(prefix_ids)[1]), WIDTH_BUCKET)
  if constraints is not None:
    covered &= tf.equal(constraint_width(constraints, size), min(NARROW_CONSTRAINTS, size))
  return covered


def bucketed_search(search, source_ids, prefix_ids=None, seeds=None, constraints=None,
                    max_constraint_tokens: int = 32, widths=None):
  """search(source_ids, prefix_ids, seeds, constraints) -> (ids [B, ...], scores [B, ...]) of
  an XLA-compiled search, run on its inputs padded to their shape buckets and cut back.

  Args:
    search: the compiled tf.function (decoding.decode's arguments after the model).
    source_ids: int32 [B, S]; prefix_ids: optional int32 [B, P]; seeds: optional int64 [B];
    constraints: optional lexical_constraints.Constraints [B, ...]; max_constraint_tokens:
      their wide width (`constraint_width`).
    widths: optional width_ladder: the sources are padded to its widths, not to multiples of
      WIDTH_BUCKET.
  """
  batch = tf.shape(source_ids)[0]
  if prefix_ids is None:
    # a prefix that forces nothing: the searches with and without a prefix are then one XLA
    # program at each shape (compiled programs are what an export's load time and its memory
    # mappings grow with), at the cost of a test per step (search_ops.force_prefix)
    prefix_ids = tf.zeros([batch, 0], tf.int32)
  # the batch padded to a power of two with copies of its first sentence (they end when it
  # does, so the loop runs no longer), the widths to multiples of 16 (a sentence's search
  # stops at its own length limit, so neither changes its result), the constraints to one of
  # two widths
  padded_batch = bucket_rows(batch)
  padded = [bucketed(source_ids, padded_batch - batch, widths),
            bucketed(prefix_ids, padded_batch - batch)]
  if seeds is not None:
    seeds = tf.concat([seeds, tf.tile(seeds[:1], [padded_batch - batch])], axis=0)
  if constraints is not None:
    constraints = bucketed_constraints(constraints, padded_batch - batch,
                                       max_constraint_tokens)
  # a traced search per static shape its callers know: with those forgotten, one for all
  padded = [shape_forgotten(ids) for ids in padded]
  ids, scores = search(*padded, seeds, constraints)
  return ids[:batch], scores[:batch]
