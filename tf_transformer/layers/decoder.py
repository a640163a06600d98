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
           cache=None, decode_index=None, training=None, return_attention=False):
    """Decodes one layer.

    Args:
      inputs: [batch, length, d_model] (length 1 when decoding step by step).
      memory: [batch, source_length, d_model] encoder output (unused when `cache` holds the
        projected cross-attention keys/values).
      self_attention_bias: float32 [batch or 1, 1, length, length], or
        [batch, 1, 1, max_length] with a cache.
      cross_attention_bias: float32 [sources, 1, 1, source_length].
      padding_mask: bool [batch, length], True at real tokens (for the padding-aware FFN).
      cache: dict {"self": {"key", "value"} [batch, heads, max_length, depth],
        "cross": {"key", "value"} [sources, heads, source_length, depth]}, where each source
        serves batch / sources consecutive rows (the hypotheses of a beam).
      decode_index: int32 scalar, the position of inputs[:, 0] when decoding with a cache.
      training: enables dropout.
      return_attention: without a cache, also return the cross-attention weights float32
        [batch, heads, length, source_length].

    Returns:
      [batch, length, d_model]; with a cache, the tuple (output, updated self-attention
      cache); with `return_attention`, the tuple (output, cross-attention weights).
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
                             cache=cross_cache, training=training,
                             return_weights=return_attention)
    if return_attention:
      y, weights = y
    x = block(x, y, training=training)
    y = self.ffn(self.ffn_block.sublayer_input(x), padding_mask, training=training)
    x = self.ffn_block(x, y, training=training)
    if cache is not None:
      return x, self_cache
    return (x, weights) if return_attention else x


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(LayerStack):
  """`num_layers` DecoderLayers, then a final layer norm when pre-norm."""

  layer_class = DecoderLayer

  def init_cache(self, memory, max_length: int):
    """Decoding state for `max_length` steps over the encoder output `memory` [B, S, d_model].

    Returns:
      dict with "self": per layer {"key", "value"} zeros [B, H, max_length, D], the buffers
      each step writes; and "cross": per layer {"key", "value"} [B, H, S, D], the projected
      memory, fixed for the whole decoding and shared by a source's beam hypotheses (which is
      why the two parts are kept apart: only "self" grows to B * K rows).
    """
    batch = tf.shape(memory)[0]
    self_caches, cross_caches = [], []
    for layer in self.stack:
      heads = layer.num_heads
      depth = memory.shape[-1] // heads
      zeros = tf.zeros([batch, heads, max_length, depth], self.compute_dtype)
      self_caches.append({"key": zeros, "value": zeros})
      cross_caches.append(layer.cross_attention.project_memory(memory))
    return {"self": self_caches, "cross": cross_caches}

  def call(self, inputs, memory, self_attention_bias, cross_attention_bias, padding_mask=None,
           cache=None, decode_index=None, training=None, return_attention=False):
    """inputs [batch, length, d_model] embedded targets -> [batch, length, d_model].

    See DecoderLayer.call for the arguments. `cache` is the dict from `init_cache` (its "self"
    part may have K times the rows of its "cross" part); with it the result is the tuple
    (output, updated cache). Without a cache, `return_attention` adds the last layer's
    cross-attention weights averaged over heads, float32 [batch, length, source_length].
    """
    x = inputs
    if cache is None:
      last = len(self.stack) - 1
      for i, layer in enumerate(self.stack):
        x = layer(x, memory, self_attention_bias, cross_attention_bias, padding_mask,
                  training=training, return_attention=return_attention and i == last)
      if return_attention:
        x, weights = x
        return self.final_norm(x), tf.reduce_mean(weights, axis=1)
      return self.final_norm(x)
    self_caches = []
    for layer, self_cache, cross_cache in zip(self.stack, cache["self"], cache["cross"]):
      x, self_cache = layer(x, memory, self_attention_bias, cross_attention_bias, padding_mask,
                            cache={"self": self_cache, "cross": cross_cache},
                            decode_index=decode_index, training=training)
      self_caches.append(self_cache)
    return self.final_norm(x), {"self": self_caches, "cross": cache["cross"]}
