"""Greedy decoding with the model's key/value cache, inside one tf.while_loop."""

import tensorflow as tf

from data_pipeline.tokenizer import BOS_ID, EOS_ID
from tf_transformer.layers.attention_bias import PAD_ID


def greedy_decode(model, source_ids, max_decode_length):
  """Decodes the argmax token at each step until every sequence emitted EOS.

  Args:
    model: a Transformer.
    source_ids: int32 [batch, source_length], PAD_ID-padded, EOS-terminated.
    max_decode_length: int32 scalar, the most tokens generated (EOS included).

  Returns:
    int32 [batch, max_decode_length]: the tokens, EOS included, PAD_ID after it.
  """
  batch = tf.shape(source_ids)[0]
  memory, cross_bias = model.encode(source_ids, training=False)
  cache = model.init_decode_cache(memory, max_decode_length)
  output = tf.TensorArray(tf.int32, size=max_decode_length)

  def not_done(step, ids, finished, cache, output):
    return tf.logical_and(step < max_decode_length, tf.logical_not(tf.reduce_all(finished)))

  def body(step, ids, finished, cache, output):
    logits, cache = model.decode_step(ids, step, cross_bias, cache)
    next_ids = tf.where(finished, PAD_ID, tf.argmax(logits, axis=-1, output_type=tf.int32))
    finished = tf.logical_or(finished, tf.equal(next_ids, EOS_ID))
    return step + 1, next_ids, finished, cache, output.write(step, next_ids)

  step, _, _, _, output = tf.while_loop(
      not_done, body,
      (tf.constant(0), tf.fill([batch], BOS_ID), tf.zeros([batch], tf.bool), cache, output))
  tokens = tf.transpose(output.stack())  # -> [batch, steps]
  return tf.pad(tokens, [[0, 0], [0, max_decode_length - step]], constant_values=PAD_ID)


def strip_after_eos(ids):
  """int32 [batch, length] -> ragged [batch, None] of the tokens before the first EOS."""
  is_eos = tf.equal(ids, EOS_ID)
  lengths = tf.where(tf.reduce_any(is_eos, axis=1),
                     tf.argmax(tf.cast(is_eos, tf.int32), axis=1, output_type=tf.int32),
                     tf.shape(ids)[1])
  return tf.RaggedTensor.from_tensor(ids, lengths=lengths)
