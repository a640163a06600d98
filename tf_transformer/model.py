"""The Transformer encoder-decoder as a Keras model with `encode`, `decode` and `decode_step`."""

import keras
import tensorflow as tf

from data_pipeline.token_ids import PAD_ID
from tf_transformer.layers import attention_bias
from tf_transformer.layers.decoder import Decoder
from tf_transformer.layers.dropout import Dropout
from tf_transformer.layers.embedding import SharedEmbedding
from tf_transformer.layers.encoder import Encoder


@keras.saving.register_keras_serializable(package="tf_transformer")
class Transformer(keras.Model):
  """Encoder-decoder Transformer, "Attention Is All You Need" (Vaswani et al., 2017).

  With `shared_vocab` (one joint vocabulary) one matrix embeds source and target tokens and
  projects decoder states to logits (section 3.4). Without it the source has its own matrix
  and the target matrix still serves as the pre-softmax projection.

  Token ids: PAD_ID (0) is padding; the decoder input is the target shifted right behind BOS.
  """

  def __init__(self, source_vocab_size: int, target_vocab_size: int,
               shared_vocab: bool = True, num_layers: int = 6, d_model: int = 512,
               num_heads: int = 8, d_ff: int = 2048, dropout_rate: float = 0.1,
               attention_dropout_rate: float = 0.1, relu_dropout_rate: float = 0.1,
               norm_position: str = "post", padding_aware_ffn: bool = True, **kwargs):
    super().__init__(**kwargs)
    if shared_vocab and source_vocab_size != target_vocab_size:
      raise ValueError("shared_vocab needs one vocabulary: source_vocab_size "
                       f"{source_vocab_size} != target_vocab_size {target_vocab_size}")
    self.source_vocab_size = source_vocab_size
    self.target_vocab_size = target_vocab_size
    self.shared_vocab = shared_vocab
    self.d_model = d_model
    # the encoder's and decoder's arguments (see layers.stack)
    self.stack_args = dict(num_layers=num_layers, num_heads=num_heads, d_ff=d_ff,
                           dropout_rate=dropout_rate,
                           attention_dropout_rate=attention_dropout_rate,
                           relu_dropout_rate=relu_dropout_rate, norm_position=norm_position,
                           padding_aware_ffn=padding_aware_ffn)

    policy = self.dtype_policy
    self.target_embedding = SharedEmbedding(target_vocab_size, d_model,
                                            name="target_embedding", dtype=policy)
    self.source_embedding = (self.target_embedding if shared_vocab else
                             SharedEmbedding(source_vocab_size, d_model,
                                             name="source_embedding", dtype=policy))
    self.embedding_dropout = Dropout(dropout_rate, dtype=policy)
    self.encoder = Encoder(name="encoder", dtype=policy, **self.stack_args)
    self.decoder = Decoder(name="decoder", dtype=policy, **self.stack_args)
    self._build_all()

  def _build_all(self):
    """Creates every weight now, so checkpoints can be restored before the first call."""
    shape = (None, None, self.d_model)
    for layer in (self.target_embedding, self.source_embedding):
      if not layer.built:
        layer.build()
    self.encoder.build(shape)
    self.decoder.build(shape)
    self.built = True

  def encode(self, source_ids, training=None):
    """Encodes a source batch.

    Args:
      source_ids: int32 [batch, source_length], PAD_ID-padded.

    Returns:
      memory: [batch, source_length, d_model].
      cross_attention_bias: float32 [batch, 1, 1, source_length].
    """
    bias = attention_bias.padding_bias(source_ids)
    x = self.embedding_dropout(self.source_embedding(source_ids), training=training)
    mask = tf.not_equal(source_ids, PAD_ID)
    return self.encoder(x, bias, mask, training=training), bias

  def _embed_targets(self, target_input_ids, training):
    """-> embedded targets [B, T, d_model], self-attention bias, padding mask bool [B, T]."""
    self_bias = attention_bias.decoder_self_attention_bias(target_input_ids)
    x = self.embedding_dropout(self.target_embedding(target_input_ids), training=training)
    return x, self_bias, tf.not_equal(target_input_ids, PAD_ID)

  def decode(self, target_input_ids, memory, cross_attention_bias, training=None):
    """Runs the decoder over whole target prefixes (teacher forcing).

    Args:
      target_input_ids: int32 [batch, target_length], BOS then the target shifted right.
      memory: [batch, source_length, d_model].
      cross_attention_bias: float32 [batch, 1, 1, source_length].

    Returns:
      [batch, target_length, d_model] decoder states (feed them to `logits`).
    """
    x, self_bias, mask = self._embed_targets(target_input_ids, training)
    return self.decoder(x, memory, self_bias, cross_attention_bias, mask, training=training)[0]

  def cross_attention_weights(self, target_input_ids, memory, cross_attention_bias):
    """The last decoder layer's cross-attention weights over `decode`'s pass, in inference,
    averaged over heads: float32 [batch, target_length, source_length]."""
    x, self_bias, mask = self._embed_targets(target_input_ids, False)
    return self.decoder.cross_attention_weights(x, memory, self_bias, cross_attention_bias, mask)

  def logits(self, hidden, output_kernel=None, bias=None):
    """hidden [..., d_model] -> float32 [..., target_vocab_size]; see SharedEmbedding.logits."""
    return self.target_embedding.logits(hidden, output_kernel, bias)

  def call(self, inputs, training=None):
    """inputs: (source_ids [B, S], target_input_ids [B, T]) -> float32 logits [B, T, V]."""
    source_ids, target_input_ids = inputs
    memory, bias = self.encode(source_ids, training=training)
    return self.logits(self.decode(target_input_ids, memory, bias, training=training))

  def init_decode_cache(self, memory, max_length: int):
    """Decoding state for `max_length` steps: Decoder.init_cache's "self" (the per-hypothesis
    buffers each step writes) and "cross" parts, plus "output_kernel", the pre-softmax matrix
    transposed once for the whole decoding."""
    return dict(self.decoder.init_cache(memory, max_length),
                output_kernel=self.target_embedding.output_kernel())

  def decode_step(self, ids, decode_index, cross_attention_bias, cache, logits_bias=None):
    """Logits for the next token after feeding one token per sequence.

    Args:
      ids: int32 [batch], the token at position `decode_index`.
      decode_index: int32 scalar.
      cross_attention_bias: float32 [sources, 1, 1, source_length], where batch is a multiple
        of sources (each source's K beam hypotheses are consecutive rows).
      cache: from `init_decode_cache` or the previous step; its "self" part has batch rows and
        its "cross" part sources rows.
      logits_bias: optional float32 [target_vocab_size] added to the logits.

    Returns:
      logits: float32 [batch, target_vocab_size], of the token at `decode_index + 1`.
      cache: the updated decoding state.
    """
    buffer = cache["self"][0]["key"]
    self_bias = attention_bias.cached_step_bias(buffer.shape[2] or tf.shape(buffer)[2],
                                                decode_index)
    x = self.target_embedding.embed(ids[:, tf.newaxis], decode_index[tf.newaxis])
    x, layers = self.decoder(x, None, self_bias, cross_attention_bias, None,
                             cache={"self": cache["self"], "cross": cache["cross"]},
                             decode_index=decode_index)
    return (self.logits(x[:, 0, :], cache["output_kernel"], logits_bias),
            dict(cache, **layers))

  def get_config(self):
    config = super().get_config()
    config.update(source_vocab_size=self.source_vocab_size,
                  target_vocab_size=self.target_vocab_size, shared_vocab=self.shared_vocab,
                  d_model=self.d_model, **self.stack_args)
    return config
