"""The Transformer encoder: a stack of self-attention + feed-forward layers."""

import keras

from tf_transformer.layers.stack import LayerStack, TransformerLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class EncoderLayer(TransformerLayer):
  """One encoder layer, "Attention Is All You Need" section 3.1."""

  def __init__(self, *args, **kwargs):
    """Takes TransformerLayer's arguments."""
    super().__init__(*args, **kwargs)
    self.self_attention = self._attention("self_attention", self_attention=True)
    self.attention_block = self._residual("attention_block")
    self.ffn = self._feed_forward()
    self.ffn_block = self._residual("ffn_block")

  def build(self, inputs_shape, *args, **kwargs):
    for layer in (self.self_attention, self.attention_block, self.ffn, self.ffn_block):
      layer.build(inputs_shape)

  def call(self, inputs, bias, layout, training=None):
    """Encodes one layer.

    Args:
      inputs: [R, d_model] token rows of `layout` over [batch, length].
      bias: float32 [batch, 1, 1, length], the source padding bias.
      layout: a TokenLayout.

    Returns:
      [R, d_model].
    """
    y, _ = self.self_attention(self.attention_block.sublayer_input(inputs), bias,
                               layout=layout, training=training)
    x = self.attention_block(inputs, y, training=training)
    y = self.ffn(self.ffn_block.sublayer_input(x), training=training,
                 static_rows=not layout.skip_padding)
    return self.ffn_block(x, y, training=training)


@keras.saving.register_keras_serializable(package="tf_transformer")
class Encoder(LayerStack):
  """`num_layers` EncoderLayers, then a final layer norm when pre-norm."""

  layer_class = EncoderLayer

  def call(self, inputs, bias, layout, training=None):
    """inputs: [R, d_model] embedded source rows of `layout` (a TokenLayout over
    [batch, length]); bias [batch, 1, 1, length]. Returns [R, d_model]."""
    x = inputs
    for layer in self.stack:
      x = layer(x, bias, layout=layout, training=training)
    return self.final_norm(x)
