"""The Transformer encoder: a stack of self-attention + feed-forward layers."""

import keras
import tensorflow as tf

from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.feed_forward import FeedForward
from tf_transformer.layers.residual import FinalNorm, ResidualNorm


@keras.saving.register_keras_serializable(package="tf_transformer")
class EncoderLayer(keras.layers.Layer):
  """One encoder layer, "Attention Is All You Need" section 3.1."""

  def __init__(self, num_heads: int, d_ff: int, dropout_rate: float = 0.1,
               attention_dropout_rate: float = 0.1, relu_dropout_rate: float = 0.1,
               norm_position: str = "post", padding_aware_ffn: bool = True, **kwargs):
    super().__init__(**kwargs)
    self.num_heads = num_heads
    self.d_ff = d_ff
    self.dropout_rate = dropout_rate
    self.attention_dropout_rate = attention_dropout_rate
    self.relu_dropout_rate = relu_dropout_rate
    self.norm_position = norm_position
    self.padding_aware_ffn = padding_aware_ffn
    self.self_attention = MultiHeadAttention(num_heads, attention_dropout_rate,
                                             self_attention=True, name="self_attention",
                                             dtype=self.dtype_policy)
    self.attention_block = ResidualNorm(dropout_rate, norm_position, name="attention_block",
                                        dtype=self.dtype_policy)
    self.ffn = FeedForward(d_ff, relu_dropout_rate, padding_aware_ffn, name="ffn",
                           dtype=self.dtype_policy)
    self.ffn_block = ResidualNorm(dropout_rate, norm_position, name="ffn_block",
                                  dtype=self.dtype_policy)

  def build(self, inputs_shape, *args, **kwargs):
    for layer in (self.self_attention, self.attention_block, self.ffn, self.ffn_block):
      layer.build(inputs_shape)

  def call(self, inputs, bias, padding_mask, training=None):
    """Encodes one layer.

    Args:
      inputs: [batch, length, d_model].
      bias: float32 [batch, 1, 1, length], the source padding bias.
      padding_mask: bool [batch, length], True at real tokens.

    Returns:
      [batch, length, d_model].
    """
    y = self.self_attention(self.attention_block.sublayer_input(inputs), bias, training=training)
    x = self.attention_block(inputs, y, training=training)
    y = self.ffn(self.ffn_block.sublayer_input(x), padding_mask, training=training)
    return self.ffn_block(x, y, training=training)

  def compute_output_shape(self, inputs_shape, *args, **kwargs):
    return inputs_shape

  def get_config(self):
    config = super().get_config()
    config.update(num_heads=self.num_heads, d_ff=self.d_ff, dropout_rate=self.dropout_rate,
                  attention_dropout_rate=self.attention_dropout_rate,
                  relu_dropout_rate=self.relu_dropout_rate, norm_position=self.norm_position,
                  padding_aware_ffn=self.padding_aware_ffn)
    return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class Encoder(keras.layers.Layer):
  """`num_layers` EncoderLayers, then a final layer norm when pre-norm."""

  def __init__(self, num_layers: int, **layer_kwargs):
    base_kwargs = {k: layer_kwargs.pop(k) for k in ("name", "dtype", "trainable")
                   if k in layer_kwargs}
    super().__init__(**base_kwargs)
    self.num_layers = num_layers
    self.layer_kwargs = dict(layer_kwargs)
    # attributes, not a list: tf.train.Checkpoint does not track Keras 3 lists of layers
    for i in range(num_layers):
      setattr(self, f"layer_{i}", EncoderLayer(**layer_kwargs, name=f"layer_{i}",
                                         dtype=self.dtype_policy))
    self.final_norm = FinalNorm(layer_kwargs.get("norm_position", "post"), name="final_norm",
                                dtype=self.dtype_policy)

  @property
  def stack(self) -> list:
    """The layers, bottom first."""
    return [getattr(self, f"layer_{i}") for i in range(self.num_layers)]

  def build(self, inputs_shape, *args, **kwargs):
    for layer in self.stack:
      layer.build(inputs_shape)
    self.final_norm.build(inputs_shape)

  def call(self, inputs, bias, padding_mask, training=None):
    """inputs: [batch, length, d_model] embedded source; bias [batch, 1, 1, length];
    padding_mask: bool [batch, length]. Returns [batch, length, d_model]."""
    x = inputs
    for layer in self.stack:
      x = layer(x, bias, padding_mask, training=training)
    return self.final_norm(x)

  def compute_output_shape(self, inputs_shape, *args, **kwargs):
    return inputs_shape

  def get_config(self):
    config = super().get_config()
    config.update(num_layers=self.num_layers, **self.layer_kwargs)
    return config
