"""What the encoder and decoder share: a layer's hyper-parameters and sublayers, and the stack."""

import keras

from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.feed_forward import FeedForward
from tf_transformer.layers.residual import FinalNorm, ResidualNorm

_LAYER_ARGS = ("num_heads", "d_ff", "dropout_rate", "attention_dropout_rate",
               "relu_dropout_rate", "norm_position", "max_relative_position", "activation",
               "projection_biases", "layer_norm_epsilon")


class TransformerLayer(keras.layers.Layer):
  """Base of EncoderLayer and DecoderLayer: stores and serializes their hyper-parameters.

  Args:
    num_heads: attention heads.
    d_ff: inner width of the feed-forward sublayer.
    dropout_rate: dropout on each sublayer output before the residual add.
    attention_dropout_rate: dropout on attention weights.
    relu_dropout_rate: dropout after the feed-forward activation.
    norm_position: "post" (the paper) or "pre".
    max_relative_position: K > 0: self-attention with relative position representations of
      distances clipped to [-K, K] (see MultiHeadAttention); 0: none.
    activation: the feed-forward's (feed_forward.ACTIVATIONS).
    projection_biases: the attention projections add biases (MultiHeadAttention's use_bias).
    layer_norm_epsilon: the layer norms' epsilon.
  """

  def __init__(self, num_heads: int, d_ff: int, dropout_rate: float = 0.1,
               attention_dropout_rate: float = 0.1, relu_dropout_rate: float = 0.1,
               norm_position: str = "post", max_relative_position: int = 0,
               activation: str = "relu", projection_biases: bool = False,
               layer_norm_epsilon: float = 1e-6, **kwargs):
    super().__init__(**kwargs)
    self.num_heads = num_heads
    self.d_ff = d_ff
    self.dropout_rate = dropout_rate
    self.attention_dropout_rate = attention_dropout_rate
    self.relu_dropout_rate = relu_dropout_rate
    self.norm_position = norm_position
    self.max_relative_position = max_relative_position
    self.activation = activation
    self.projection_biases = projection_biases
    self.layer_norm_epsilon = layer_norm_epsilon

  def _attention(self, name: str, self_attention: bool) -> MultiHeadAttention:
    return MultiHeadAttention(self.num_heads, self.attention_dropout_rate, self_attention,
                              self.max_relative_position if self_attention else 0,
                              use_bias=self.projection_biases, name=name,
                              dtype=self.dtype_policy)

  def _residual(self, name: str) -> ResidualNorm:
    """The dropout, residual add and layer norm around one sublayer."""
    return ResidualNorm(self.dropout_rate, self.norm_position, self.layer_norm_epsilon,
                        name=name, dtype=self.dtype_policy)

  def _feed_forward(self) -> FeedForward:
    return FeedForward(self.d_ff, self.relu_dropout_rate, self.activation, name="ffn",
                       dtype=self.dtype_policy)

  def compute_output_shape(self, inputs_shape, *args, **kwargs):
    return inputs_shape

  def get_config(self):
    config = super().get_config()
    config.update({name: getattr(self, name) for name in _LAYER_ARGS})
    return config


class LayerStack(keras.layers.Layer):
  """Base of Encoder and Decoder: `num_layers` layers of `layer_class`, then a final norm.

  The final layer norm exists in pre-norm stacks only (post-norm layers end normalized).
  Subclasses set `layer_class` and define `call` over `self.stack`.
  """

  layer_class = TransformerLayer

  def __init__(self, num_layers: int, **layer_kwargs):
    base_kwargs = {k: layer_kwargs.pop(k) for k in ("name", "dtype", "trainable")
                   if k in layer_kwargs}
    super().__init__(**base_kwargs)
    self.num_layers = num_layers
    self.layer_kwargs = dict(layer_kwargs)
    # attributes, not a list: tf.train.Checkpoint does not track Keras 3 lists of layers
    for i in range(num_layers):
      setattr(self, f"layer_{i}", self.layer_class(**layer_kwargs, name=f"layer_{i}",
                                                    dtype=self.dtype_policy))
    self.final_norm = FinalNorm(layer_kwargs.get("norm_position", "post"),
                                layer_kwargs.get("layer_norm_epsilon", 1e-6), name="final_norm",
                                dtype=self.dtype_policy)

  @property
  def stack(self) -> list:
    """The layers, bottom first."""
    return [getattr(self, f"layer_{i}") for i in range(self.num_layers)]

  def build(self, inputs_shape, *args, **kwargs):
    for layer in self.stack:
      layer.build(inputs_shape)
    self.final_norm.build(inputs_shape)

  def compute_output_shape(self, inputs_shape, *args, **kwargs):
    return inputs_shape

  def get_config(self):
    config = super().get_config()
    config.update(num_layers=self.num_layers, **self.layer_kwargs)
    return config
