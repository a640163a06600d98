"""Where the real tokens of a padded batch are, and the moves between padded and token rows."""

import tensorflow as tf


class TokenLayout:
  """The rows that the layers compute for a padded [batch, length] batch.

  Between sublayers, hidden states are rows [R, d_model]. With `skip_padding` the rows are the
  real tokens only (R = N, in row-major order), so projections, feed-forward, residuals, layer
  norms and dropout spend nothing on padding (a quarter of a bucketed batch's positions).
  Without it every position is a row (R = batch * length): static shapes, for XLA and TPUs.
  Only attention's core needs the padded layout [batch, length, ...]; `to_padded` and
  `to_rows` move between the two.

  The moves have hand-written gradients that read only real positions: the slots `to_padded`
  fills at padding hold copies of real rows (finite values hidden by the attention bias, never
  zeros, which would cost a pass), and nothing downstream of them may reach the loss. That
  holds inside attention: padded keys get zero weight and padded queries' outputs are dropped
  by `to_rows`.
  """

  def __init__(self, mask, skip_padding: bool = True):
    """mask: bool [batch, length], True at real tokens."""
    self.mask = mask
    self.skip_padding = skip_padding
    shape = tf.shape(mask)
    self.batch, self.length = shape[0], shape[1]
    if skip_padding:
      flat = tf.reshape(mask, [-1])
      # row of each real position, and for each position the row it reads (a padded one
      # reads the row of the real token before it: any finite value will do)
      self._real_positions = tf.cast(tf.where(flat)[:, 0], tf.int32)  # -> [N]
      self._source_rows = tf.maximum(tf.cumsum(tf.cast(flat, tf.int32)) - 1, 0)  # -> [B * T]

  @classmethod
  def of_ids(cls, ids, pad_id: int, skip_padding: bool = True):
    """The layout of token ids int [batch, length], where `pad_id` marks padding."""
    return cls(tf.not_equal(ids, pad_id), skip_padding)

  @classmethod
  def dense(cls, batch, length):
    """Every position of [batch, length] is a row (decoding steps, padded memory)."""
    return cls(tf.ones([batch, length], tf.bool), skip_padding=False)

  def rows_of(self, padded):
    """padded [batch, length, ...] -> its rows [R, ...] (any dtype, no gradient moves)."""
    flat = tf.reshape(padded, tf.concat([[-1], tf.shape(padded)[2:]], axis=0))
    return tf.gather(flat, self._real_positions) if self.skip_padding else flat

  @property
  def positions(self):
    """int32 [R]: each row's position in its sequence (for positional encodings)."""
    return self.rows_of(tf.broadcast_to(tf.range(self.length), [self.batch, self.length]))

  @property
  def row_weights(self):
    """float32 [R], 1 at real tokens and 0 at padding; None when every row is real."""
    return None if self.skip_padding else tf.reshape(tf.cast(self.mask, tf.float32), [-1])

  def to_padded(self, rows):
    """rows [R, k] -> [batch, length, k]; padded slots hold finite filler (see class doc)."""
    shape = [self.batch, self.length, _last_dim(rows)]  # not -1: batch may be 0 (an empty share)
    if not self.skip_padding:
      return tf.reshape(rows, shape)
    real_positions, source_rows = self._real_positions, self._source_rows

    @tf.custom_gradient
    def spread(rows):
      def gradient(d_padded):
        return tf.gather(tf.reshape(d_padded, [-1, _last_dim(rows)]), real_positions)
      return tf.gather(rows, source_rows), gradient

    return tf.reshape(spread(rows), shape)

  def to_rows(self, padded):
    """padded [batch, length, k] -> rows [R, k]; the gradient is zero at padded slots."""
    flat = tf.reshape(padded, [-1, _last_dim(padded)])
    if not self.skip_padding:
      return flat
    real_positions, source_rows = self._real_positions, self._source_rows
    is_real = tf.reshape(self.mask, [-1, 1])

    @tf.custom_gradient
    def collect(flat):
      def gradient(d_rows):
        return tf.where(is_real, tf.gather(d_rows, source_rows), tf.zeros((), d_rows.dtype))
      return tf.gather(flat, real_positions), gradient

    return collect(flat)


def _last_dim(x):
  return x.shape[-1] if x.shape[-1] is not None else tf.shape(x)[-1]
