"""The reserved subword ids, and the decoder input built from them.

Every SentencePiece model trained here reserves the first four ids, so the model, the input
pipeline and decoding agree on them without reading a vocabulary.
"""

import tensorflow as tf

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def decoder_inputs(target_ids: tf.Tensor) -> tf.Tensor:
  """The decoder's input for teacher forcing: BOS, then the target shifted right.

  Position t then predicts target token t from the tokens before it; positions whose label is
  padding are padding too.

  Args:
    target_ids: int32 [batch, length], EOS-terminated and PAD_ID-padded.

  Returns:
    int32 [batch, length].
  """
  batch = tf.shape(target_ids)[0]
  shifted = tf.concat([tf.fill([batch, 1], BOS_ID), target_ids[:, :-1]], axis=1)
  return tf.where(tf.equal(target_ids, PAD_ID), PAD_ID, shifted)
