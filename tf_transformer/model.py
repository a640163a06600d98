"""The Transformer encoder-decoder as a Keras model with `encode`, `decode` and `decode_step`."""

import dataclasses

import keras
import tensorflow as tf

from data_pipeline.token_ids import PAD_ID
from tf_transformer.config import ModelConfig
from tf_transformer.layers import attention_bias
from tf_transformer.layers.decoder import Decoder
from tf_transformer.layers.dropout import Dropout
from tf_transformer.layers.embedding import SharedEmbedding, add_biases
from tf_transformer.layers.encoder import Encoder
from tf_transformer.layers.token_layout import TokenLayout


@keras.saving.register_keras_serializable(package="tf_transformer")
class Transformer(keras.Model):
  """Encoder-decoder Transformer, "Attention Is All You Need" (Vaswani et al., 2017).

  With `shared_vocab` (one joint vocabulary) one matrix embeds source and target tokens and
  projects decoder states to logits (section 3.4). Without it the source has its own matrix
  and the target matrix still serves as the pre-softmax projection.

  Token ids: PAD_ID (0) is padding; the decoder input is the target shifted right behind BOS.

  With `skip_padding` the layers compute the real tokens only (see TokenLayout); without it
  they compute every padded position too, which keeps shapes static (XLA, TPUs).

  position_encoding: "sinusoidal" (section 3.5, added to the embeddings) or "relative"
  (Shaw et al., 2018: every self-attention layer learns representations of the distances
  clipped to `max_relative_position`, and the embeddings carry no position).

  The options that hold other toolkits' models (config.ModelConfig): the feed-forward's
  `activation`, `projection_biases` of the attention, `layer_norm_epsilon`, a learned
  `output_bias` of the logits, the `sinusoid_layout` of the positions and `scale_embeddings`
  (by sqrt(d_model)).
  """

  def __init__(self, source_vocab_size: int, target_vocab_size: int,
               shared_vocab: bool = True, num_layers: int = 6, d_model: int = 512,
               num_heads: int = 8, d_ff: int = 2048, dropout_rate: float = 0.1,
               attention_dropout_rate: float = 0.1, relu_dropout_rate: float = 0.1,
               norm_position: str = "post", skip_padding: bool = True,
               position_encoding: str = "sinusoidal", max_relative_position: int = 0,
               activation: str = "relu", projection_biases: bool = False,
               layer_norm_epsilon: float = 1e-6, output_bias: bool = False,
               sinusoid_layout: str = "interleaved", scale_embeddings: bool = True, **kwargs):
    super().__init__(**kwargs)
    if shared_vocab and source_vocab_size != target_vocab_size:
      raise ValueError("shared_vocab needs one vocabulary: source_vocab_size "
                       f"{source_vocab_size} != target_vocab_size {target_vocab_size}")
    self.source_vocab_size = source_vocab_size
    self.target_vocab_size = target_vocab_size
    self.shared_vocab = shared_vocab
    self.d_model = d_model
    self.skip_padding = skip_padding
    self.position_encoding = position_encoding
    # the encoder's and decoder's arguments (see layers.stack)
    self.stack_args = dict(num_layers=num_layers, num_heads=num_heads, d_ff=d_ff,
                           dropout_rate=dropout_rate,
                           attention_dropout_rate=attention_dropout_rate,
                           relu_dropout_rate=relu_dropout_rate, norm_position=norm_position,
                           max_relative_position=max_relative_position, activation=activation,
                           projection_biases=projection_biases,
                           layer_norm_epsilon=layer_norm_epsilon)
    self.embedding_args = dict(output_bias=output_bias, sinusoid_layout=sinusoid_layout,
                               scale_embeddings=scale_embeddings)

    policy = self.dtype_policy
    embedding = dict(scale=scale_embeddings, sinusoid_layout=sinusoid_layout, dtype=policy)
    self.target_embedding = SharedEmbedding(target_vocab_size, d_model, output_bias=output_bias,
                                            name="target_embedding", **embedding)
    self.source_embedding = (self.target_embedding if shared_vocab else
                             SharedEmbedding(source_vocab_size, d_model,
                                             name="source_embedding", **embedding))
    self.embedding_dropout = Dropout(dropout_rate, dtype=policy)
    self.encoder = Encoder(name="encoder", dtype=policy, **self.stack_args)
    self.decoder = Decoder(name="decoder", dtype=policy, **self.stack_args)
    self._build_all()

  def _build_all(self):
    """Creates every weight now, so checkpoints can be restored before the first call."""
    shape = (None, self.d_model)  # token rows
    for layer in (self.target_embedding, self.source_embedding):
      if not layer.built:
        layer.build()
    self.encoder.build(shape)
    self.decoder.build(shape)
    self.built = True

  def _embed(self, embedding, ids, training):
    """ids int32 [B, L] -> their TokenLayout and its embedded rows [R, d_model]."""
    layout = TokenLayout.of_ids(ids, PAD_ID, self.skip_padding)
    x = embedding.embed(layout.rows_of(ids), self._absolute(layout.positions))
    return layout, self.embedding_dropout(x, training=training)

  def _absolute(self, positions):
    """`positions` for the embeddings to encode, or None with relative positions."""
    return positions if self.position_encoding == "sinusoidal" else None

  def encode_rows(self, source_ids, training=None):
    """Encodes a source batch into token rows.

    Args:
      source_ids: int32 [batch, source_length], PAD_ID-padded.

    Returns:
      memory: [M, d_model] rows of `layout`.
      layout: the TokenLayout of the source.
      cross_attention_bias: float32 [batch, 1, 1, source_length].
    """
    bias = attention_bias.padding_bias(source_ids)
    layout, x = self._embed(self.source_embedding, source_ids, training)
    return self.encoder(x, bias, layout=layout, training=training), layout, bias

  def decode_rows(self, target_input_ids, memory, memory_layout, cross_attention_bias,
                  training=None):
    """Runs the decoder over whole target prefixes (teacher forcing), in token rows.

    Args:
      target_input_ids: int32 [batch, target_length], BOS then the target shifted right.
      memory, memory_layout, cross_attention_bias: from `encode_rows`.

    Returns:
      states: [R, d_model] decoder states of `layout`'s rows (feed them to `logits`).
      layout: the TokenLayout of the targets.
    """
    self_bias = attention_bias.decoder_self_attention_bias(target_input_ids)
    layout, x = self._embed(self.target_embedding, target_input_ids, training)
    states, _ = self.decoder(x, memory, self_bias, cross_attention_bias, layout=layout,
                             memory_layout=memory_layout, training=training)
    return states, layout

  def encode(self, source_ids, training=None):
    """`encode_rows` in the padded layout, for decoding.

    Returns:
      memory: [batch, source_length, d_model]; the padded positions hold filler that the bias
        hides.
      cross_attention_bias: float32 [batch, 1, 1, source_length].
    """
    memory, layout, bias = self.encode_rows(source_ids, training=training)
    return layout.to_padded(memory), bias

  @staticmethod
  def _padded_memory_rows(memory):
    """memory [B, S, d_model] -> its rows and their (dense) TokenLayout."""
    shape = tf.shape(memory)
    return tf.reshape(memory, [-1, memory.shape[-1]]), TokenLayout.dense(shape[0], shape[1])

  def decode(self, target_input_ids, memory, cross_attention_bias, training=None):
    """`decode_rows` in the padded layout.

    Args:
      target_input_ids: int32 [batch, target_length].
      memory: [batch, source_length, d_model], from `encode`.
      cross_attention_bias: float32 [batch, 1, 1, source_length].

    Returns:
      [batch, target_length, d_model] decoder states (filler at padded positions).
    """
    states, layout = self.decode_rows(target_input_ids, *self._padded_memory_rows(memory),
                                      cross_attention_bias, training=training)
    return layout.to_padded(states)

  def cross_attention_weights(self, target_input_ids, memory, cross_attention_bias):
    """The last decoder layer's cross-attention weights over `decode`'s pass, in inference,
    averaged over heads: float32 [batch, target_length, source_length] (filler in the rows of
    padded target positions)."""
    self_bias = attention_bias.decoder_self_attention_bias(target_input_ids)
    layout, x = self._embed(self.target_embedding, target_input_ids, False)
    memory, memory_layout = self._padded_memory_rows(memory)
    return self.decoder.cross_attention_weights(x, memory, self_bias, cross_attention_bias,
                                                layout, memory_layout)

  def logits(self, hidden, output_kernel=None, bias=None):
    """hidden [..., d_model] -> float32 [..., target_vocab_size] (or [..., n] with the kernel of
    n ids); see SharedEmbedding.logits."""
    return self.target_embedding.logits(hidden, output_kernel, bias)

  def call(self, inputs, training=None):
    """inputs: (source_ids [B, S], target_input_ids [B, T]) -> float32 logits [B, T, V]."""
    source_ids, target_input_ids = inputs
    memory, bias = self.encode(source_ids, training=training)
    return self.logits(self.decode(target_input_ids, memory, bias, training=training))

  def init_decode_cache(self, memory, buffer_length: int, output_ids=None):
    """Decoding state for `buffer_length` steps: Decoder.init_cache's "self" (the per-hypothesis
    buffers each step writes) and "cross" parts, plus "output_kernel", the pre-softmax matrix
    transposed once for the whole decoding; with `output_ids` (int32 [sources, n]: each
    source's vocabulary shortlist) each source's columns of its target ids only, and
    `decode_step` gives the n logits of each row's source; "output_bias", the learned output
    bias of the same columns (None without one)."""
    return dict(self.decoder.init_cache(memory, buffer_length),
                output_kernel=self.target_embedding.output_kernel(output_ids),
                output_bias=self.target_embedding.output_bias_columns(output_ids))

  def decode_step(self, ids, step, cross_attention_bias, cache, logits_bias=None):
    """Logits for the next token after feeding one token per sequence.

    Args:
      ids: int32 [batch], the token at position `step`.
      step: int32 scalar.
      cross_attention_bias: float32 [sources, 1, 1, source_length], where batch is a multiple
        of sources (each source's K beam hypotheses are consecutive rows).
      cache: from `init_decode_cache` or the previous step; its "self" part has batch rows and
        its "cross" part sources rows.
      logits_bias: optional float32 [target_vocab_size] added to the logits ([sources, n]
        with a cache of n output ids a source).

    Returns:
      logits: float32 [batch, target_vocab_size] ([batch, n] with a cache of n output ids), of
        the token at `step + 1`.
      cache: the updated decoding state.
    """
    buffer = cache["self"][0]["key"]
    self_bias = attention_bias.cached_step_bias(buffer.shape[2] or tf.shape(buffer)[2],
                                                step)
    x = self.target_embedding.embed(ids, self._absolute(step))
    layout = TokenLayout.dense(tf.shape(ids)[0], 1)
    x, layers = self.decoder(x, None, self_bias, cross_attention_bias, layout=layout,
                             cache={"self": cache["self"], "cross": cache["cross"]},
                             step=step)
    bias = add_biases(logits_bias, cache["output_bias"])
    return self.logits(x, cache["output_kernel"], bias), dict(cache, **layers)

  def get_config(self):
    config = super().get_config()
    config.update(source_vocab_size=self.source_vocab_size,
                  target_vocab_size=self.target_vocab_size, shared_vocab=self.shared_vocab,
                  d_model=self.d_model, skip_padding=self.skip_padding,
                  position_encoding=self.position_encoding, **self.stack_args,
                  **self.embedding_args)
    return config


def build_model(config: ModelConfig, dtype=None) -> Transformer:
  """The Transformer of `config`, its variables created.

  Args:
    dtype: a Keras dtype policy name ("mixed_bfloat16", ...); None: float32.
  """
  return Transformer(**dataclasses.asdict(config), dtype=dtype)
