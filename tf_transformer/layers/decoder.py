"""The Transformer decoder: causal self-attention, cross-attention and feed-forward layers."""

import keras
import tensorflow as tf

from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.feed_forward import FeedForward
from tf_transformer.layers.residual import ResidualNorm
from tf_transformer.layers.stack import LayerStack, TransformerLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(TransformerLayer):
  """One decoder layer, "Attention Is All You Need" section 3.1."""

  def __init__(self, *args, **kwargs):
    """Takes TransformerLayer's arguments."""
    super().__init__(*args, **kwargs)
    policy = self.dtype_policy
    heads, attention_dropout = self.num_heads, self.attention_dropout_rate
    self.self_attention = MultiHeadAttention(heads, attention_dropout, True,
                                             name="self_attention", dtype=policy)
    self.self_attention_block = ResidualNorm(self.dropout_rate, self.norm_position,
                                             name="self_attention_block", dtype=policy)
    self.cross_attention = MultiHeadAttention(heads, attention_dropout, False,
                                              name="cross_attention", dtype=policy)
    self.cross_attention_block = ResidualNorm(self.dropout_rate, self.norm_position,
                                              name="cross_attention_block", dtype=policy)
    self.ffn = FeedForward(self.d_ff, self.relu_dropout_rate, self.padding_aware_ffn,
                           name="ffn", dtype=policy)
    self.ffn_block = ResidualNorm(self.dropout_rate, self.norm_position, name="ffn_block",
                                  dtype=policy)

  def build(self, inputs_shape, *args, **kwargs):
    for layer in (self.self_attention, self.self_attention_block, self.cross_attention_block,
                  self.ffn, self.ffn_block):
      layer.build(inputs_shape)
    self.cross_attention.build(inputs_shape, inputs_shape)

  def call(self, inputs, memory, self_attention_bias, cross_attention_bias, padding_mask=None,
           cache=None, decode_index=None, training=None):
    """Decodes one layer.

    Args:
      inputs: [batch, length, d_model] (length 1 when decoding step by step).
      memory: [batch, source_length, d_model] encoder output (unused when `cache` holds the
        projected cross-attention keys/values).
      self_attention_bias: float32 [batch or 1, 1, length, length], or
        [batch, 1, 1, max_length] with a cache.
      cross_attention_bias: float32 [batch, 1, 1, source_length].
      padding_mask: bool [batch, length], True at real tokens (for the padding-aware FFN).
      cache: dict {"self": {"key", "value"}, "cross": {"key", "value"}} of
        [batch, heads, *, depth] tensors.
      decode_index: int32 scalar, the position of inputs[:, 0] when decoding with a cache.

    Returns:
      [batch, length, d_model]; with a cache, the tuple (output, updated cache).
    """
    block = self.self_attention_block
    if cache is None:
      y = self.self_attention(block.sublayer_input(inputs), self_attention_bias,
                              training=training)
      cross_cache = None
    else:
      y, self_cache = self.self_attention(block.sublayer_input(inputs), self_attention_bias,
                                          cache=cache["self"], decode_index=decode_index,
                                          training=training)
      cross_cache = cache["cross"]
    x = block(inputs, y, training=training)
    block = self.cross_attention_block
    y = self.cross_attention(block.sublayer_input(x), cross_attention_bias, memory=memory,
                             cache=cross_cache, training=training)
    x = block(x, y, training=training)
    y = self.ffn(self.ffn_block.sublayer_input(x), padding_mask, training=training)
    x = self.ffn_block(x, y, training=training)
    if cache is None:
      return x
    return x, {"self": self_cache, "cross": cross_cache}


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(LayerStack):
  """`num_layers` DecoderLayers, then a final layer norm when pre-norm."""

  layer_class = DecoderLayer

  def init_cache(self, memory, max_length: int):
    """Decoding state for `max_length` steps over the encoder output `memory` [B, S, d_model].

    Returns:
      list (one per layer) of {"self": {"key", "value"}: zeros [B, H, max_length, D],
      "cross": {"key", "value"}: [B, H, S, D]}.
    """
    batch = tf.shape(memory)[0]
    caches = []
    for layer in self.stack:
      heads = layer.num_heads
      depth = memory.shape[-1] // heads
      zeros = tf.zeros([batch, heads, max_length, depth], self.compute_dtype)
      caches.append({"self": {"key": zeros, "value": zeros},
                     "cross": layer.cross_attention.project_memory(memory)})
    return caches

  def call(self, inputs, memory, self_attention_bias, cross_attention_bias, padding_mask=None,
           cache=None, decode_index=None, training=None):
    """inputs [batch, length, d_model] embedded targets -> [batch, length, d_model].

    See DecoderLayer.call for the arguments; `cache` is the list from `init_cache`, and with it
    the result is the tuple (output, updated cache list).
    """
    x = inputs
    if cache is None:
      for layer in self.stack:
        x = layer(x, memory, self_attention_bias, cross_attention_bias, padding_mask,
                  training=training)
      return self.final_norm(x)
    new_cache = []
    for layer, layer_cache in zip(self.stack, cache):
      x, layer_cache = layer(x, memory, self_attention_bias, cross_attention_bias, padding_mask,
                             cache=layer_cache, decode_index=decode_index, training=training)
      new_cache.append(layer_cache)
    return self.final_norm(x), new_cache
