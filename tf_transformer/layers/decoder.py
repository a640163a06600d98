"""The Transformer decoder: causal self-attention, cross-attention and feed-forward layers."""

import keras
import tensorflow as tf

from tf_transformer.layers.stack import LayerStack, TransformerLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(TransformerLayer):
  """One decoder layer, "Attention Is All You Need" section 3.1."""

  def __init__(self, *args, **kwargs):
    """Takes TransformerLayer's arguments."""
    super().__init__(*args, **kwargs)
    self.self_attention = self._attention("self_attention", self_attention=True)
    self.self_attention_block = self._residual("self_attention_block")
    self.cross_attention = self._attention("cross_attention", self_attention=False)
    self.cross_attention_block = self._residual("cross_attention_block")
    self.ffn = self._feed_forward()
    self.ffn_block = self._residual("ffn_block")

  def build(self, inputs_shape, *args, **kwargs):
    for layer in (self.self_attention, self.self_attention_block, self.cross_attention_block,
                  self.ffn, self.ffn_block):
      layer.build(inputs_shape)
    self.cross_attention.build(inputs_shape, inputs_shape)

  def _self_attention_sublayer(self, inputs, bias, layout, cache, step, training):
    """The self-attention sublayer with its residual block: (output, updated cache)."""
    block = self.self_attention_block
    y, cache = self.self_attention(block.sublayer_input(inputs), bias, layout=layout, cache=cache,
                                   step=step, training=training)
    return block(inputs, y, training=training), cache

  def call(self, inputs, memory, self_attention_bias, cross_attention_bias, layout,
           memory_layout=None, cache=None, step=None, training=None):
    """Decodes one layer.

    Args:
      inputs: [R, d_model] token rows of `layout` over [batch, length] (length 1 when
        decoding step by step).
      memory: [M, d_model] encoder output rows of `memory_layout` over [batch, source_length]
        (unused when `cache` holds the projected cross-attention keys/values).
      self_attention_bias: float32 [batch or 1, 1, length, length], or
        [batch or 1, 1, 1, buffer_length] with a cache.
      cross_attention_bias: float32 [sources, 1, 1, source_length].
      layout, memory_layout: TokenLayouts.
      cache: dict {"self": {"key", "value"} [batch, heads, buffer_length, depth],
        "cross": {"key", "value"} [sources, heads, source_length, depth]}, where each source
        serves batch / sources consecutive rows (the hypotheses of a beam).
      step: int32 scalar, the position of inputs[:, 0] when decoding with a cache.
      training: enables dropout.

    Returns:
      (output [R, d_model], the updated "self" cache or None without a cache).
    """
    self_cache, cross_cache = (None, None) if cache is None else (cache["self"], cache["cross"])
    x, self_cache = self._self_attention_sublayer(inputs, self_attention_bias, layout,
                                                  self_cache, step, training)
    block = self.cross_attention_block
    y, _ = self.cross_attention(block.sublayer_input(x), cross_attention_bias, layout=layout,
                                memory=memory, memory_layout=memory_layout, cache=cross_cache,
                                training=training)
    x = block(x, y, training=training)
    y = self.ffn(self.ffn_block.sublayer_input(x), training=training,
                 static_rows=not layout.skip_padding)
    return self.ffn_block(x, y, training=training), self_cache

  def cross_attention_weights(self, inputs, memory, self_attention_bias,
                              cross_attention_bias, layout, memory_layout):
    """The cross-attention weights of `call` without a cache, in inference.

    Returns:
      float32 [batch, heads, length, source_length].
    """
    x, _ = self._self_attention_sublayer(inputs, self_attention_bias, layout, None, None,
                                         False)
    return self.cross_attention.attention_weights(
        self.cross_attention_block.sublayer_input(x), cross_attention_bias, layout, memory,
        memory_layout)


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(LayerStack):
  """`num_layers` DecoderLayers, then a final layer norm when pre-norm."""

  layer_class = DecoderLayer

  def init_cache(self, memory, buffer_length: int):
    """Decoding state for `buffer_length` steps over the encoder output `memory` [B, S, d_model].

    Returns:
      dict with "self": per layer {"key", "value"} zeros [B, H, buffer_length, D], the buffers
      each step writes; and "cross": per layer {"key", "value"} [B, H, S, D], the projected
      memory, fixed for the whole decoding and shared by a source's beam hypotheses (which is
      why the two parts are kept apart: only "self" grows to B * K rows).
    """
    batch = tf.shape(memory)[0]
    self_caches, cross_caches = [], []
    for layer in self.stack:
      heads = layer.num_heads
      depth = memory.shape[-1] // heads
      zeros = tf.zeros([batch, heads, buffer_length, depth], self.compute_dtype)
      self_caches.append({"key": zeros, "value": zeros})
      cross_caches.append(layer.cross_attention.project_memory(memory))
    return {"self": self_caches, "cross": cross_caches}

  def call(self, inputs, memory, self_attention_bias, cross_attention_bias, layout,
           memory_layout=None, cache=None, step=None, training=None):
    """inputs [R, d_model] embedded target rows of `layout` -> (output, cache).

    See DecoderLayer.call for the arguments. `cache` is the dict from `init_cache` (its "self"
    part may have K times the rows of its "cross" part).

    Returns:
      (output [R, d_model], the updated cache, or None without a cache).
    """
    x = inputs
    if cache is None:
      for layer in self.stack:
        x, _ = layer(x, memory, self_attention_bias, cross_attention_bias, layout=layout,
                     memory_layout=memory_layout, training=training)
      return self.final_norm(x), None
    self_caches = []
    for layer, self_cache, cross_cache in zip(self.stack, cache["self"], cache["cross"]):
      x, self_cache = layer(x, memory, self_attention_bias, cross_attention_bias, layout=layout,
                            memory_layout=memory_layout,
                            cache={"self": self_cache, "cross": cross_cache},
                            step=step, training=training)
      self_caches.append(self_cache)
    return self.final_norm(x), {"self": self_caches, "cross": cache["cross"]}

  def cross_attention_weights(self, inputs, memory, self_attention_bias, cross_attention_bias,
                              layout, memory_layout):
    """The last layer's cross-attention weights in inference, averaged over heads.

    Args: as `call` without a cache.

    Returns:
      float32 [batch, length, source_length].
    """
    x = inputs
    for layer in self.stack[:-1]:
      x, _ = layer(x, memory, self_attention_bias, cross_attention_bias, layout=layout,
                   memory_layout=memory_layout)
    weights = self.stack[-1].cross_attention_weights(x, memory, self_attention_bias,
                                                     cross_attention_bias, layout,
                                                     memory_layout)
    return tf.reduce_mean(weights, axis=1)
