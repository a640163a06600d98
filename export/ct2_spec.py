"""A trained Transformer as a CTranslate2 model specification, with CTranslate2's own specs.

CTranslate2 decodes on CPU with fused, quantizable kernels; its converters exist for
OpenNMT, fairseq, Marian and Hugging Face models, and `TransformerConverter` adds this one.
The mapping, layer by layer (CTranslate2's linear weights are [out, in], ours [in, out]):

  embeddings (x sqrt(d_model)) + positions -> embeddings, position_encodings.encodings
                                               (scale_embeddings off without the sqrt)
  self-attention qkv_kernel, output_kernel  -> self_attention.linear[0], linear[1]
  cross-attention q_kernel, kv_kernel, out  -> attention.linear[0], linear[1], linear[2]
  each sublayer's ResidualNorm layer norm   -> that sublayer's layer_norm (before it in "pre",
                                               after the residual add in "post")
  feed-forward inner, outer                 -> ffn.linear_0, ffn.linear_1
  the final norm of a pre-norm stack        -> encoder/decoder layer_norm
  target embeddings (tied)                  -> decoder.projection, whose bias hides PAD and BOS
                                               as `decoding.never_generated_bias` does (plus
                                               the model's output bias, if any)
  the attention projections' biases         -> their linear layers' biases
  relative_keys, relative_values [2K+1, D]  -> self_attention.relative_position_keys, _values
                                               (relative positions: no position_encodings)

Source sentences get </s> appended (`add_source_eos`) and decoding starts from <s>, as here.
"""

import numpy as np

from data_pipeline.token_ids import BOS_ID, PAD_ID
from tf_transformer.layers.attention_bias import large_negative
from tf_transformer.layers.embedding import positional_encoding

# position encodings written into the model: longer inputs or outputs cannot be decoded
MAX_POSITIONS = 1024


def _linear(spec, kernel, bias=None):
  """kernel [in, out] (and bias [out]) -> a LinearSpec's weight [out, in] (and bias)."""
  spec.weight = np.ascontiguousarray(np.asarray(kernel, np.float32).T)
  if bias is not None:
    spec.bias = np.asarray(bias, np.float32)


def _norm(spec, layer_norm):
  spec.gamma = np.asarray(layer_norm.gamma, np.float32)
  spec.beta = np.asarray(layer_norm.beta, np.float32)


def _self_attention(spec, attention, block):
  biases = attention.biases
  # [q | k | v], each split into heads alike
  _linear(spec.linear[0], attention.qkv_kernel, biases.get("qkv_kernel"))
  _linear(spec.linear[1], attention.output_kernel, biases.get("output_kernel"))
  _norm(spec.layer_norm, block.norm)
  if attention.max_relative_position:
    spec.relative_position_keys = np.asarray(attention.relative_keys, np.float32)
    spec.relative_position_values = np.asarray(attention.relative_values, np.float32)


def _cross_attention(spec, attention, block):
  biases = attention.biases
  _linear(spec.linear[0], attention.q_kernel, biases.get("q_kernel"))
  _linear(spec.linear[1], attention.kv_kernel, biases.get("kv_kernel"))  # [k | v]
  _linear(spec.linear[2], attention.output_kernel, biases.get("output_kernel"))
  _norm(spec.layer_norm, block.norm)


def _feed_forward(spec, ffn, block):
  _linear(spec.linear_0, ffn.inner.kernel, ffn.inner.bias)
  _linear(spec.linear_1, ffn.outer.kernel, ffn.outer.bias)
  _norm(spec.layer_norm, block.norm)


def transformer_spec(model, source_pieces: list[str], target_pieces: list[str]):
  """The CTranslate2 TransformerSpec of `model` (a tf_transformer Transformer).

  Args:
    model: the Transformer, its weights loaded.
    source_pieces, target_pieces: the subword pieces of each vocabulary, in id order.

  Returns:
    ctranslate2.specs.TransformerSpec, ready for `validate`, `optimize` and `save`.
  """
  from ctranslate2.specs import common_spec, transformer_spec as ct2

  args = model.stack_args
  num_layers, num_heads = args["num_layers"], args["num_heads"]
  pre_norm = args["norm_position"] == "pre"
  relative = model.position_encoding == "relative"
  activation = {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH,
                "gelu": common_spec.Activation.GELU}[args["activation"]]
  spec = ct2.TransformerSpec.from_config(num_layers, num_heads, pre_norm=pre_norm,
                                         activation=activation,
                                         with_relative_position=relative)
  positions = np.asarray(positional_encoding(np.arange(MAX_POSITIONS), model.d_model,
                                             layout=model.embedding_args["sinusoid_layout"]))
  scale = model.embedding_args["scale_embeddings"]
  spec.encoder.scale_embeddings = spec.decoder.scale_embeddings = scale

  encoder, decoder = spec.encoder, spec.decoder
  encoder.embeddings[0].weight = np.asarray(model.source_embedding.embeddings, np.float32)
  if not relative:
    encoder.position_encodings.encodings = positions
  for layer_spec, layer in zip(encoder.layer, model.encoder.stack):
    _self_attention(layer_spec.self_attention, layer.self_attention, layer.attention_block)
    _feed_forward(layer_spec.ffn, layer.ffn, layer.ffn_block)

  target_embeddings = np.asarray(model.target_embedding.embeddings, np.float32)
  decoder.embeddings.weight = target_embeddings
  if not relative:
    decoder.position_encodings.encodings = positions
  for layer_spec, layer in zip(decoder.layer, model.decoder.stack):
    _self_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_block)
    _cross_attention(layer_spec.attention, layer.cross_attention, layer.cross_attention_block)
    _feed_forward(layer_spec.ffn, layer.ffn, layer.ffn_block)
  decoder.projection.weight = target_embeddings
  never_generated = np.zeros(len(target_pieces), np.float32)
  never_generated[[PAD_ID, BOS_ID]] = large_negative(np.float32)
  output_bias = model.target_embedding.output_bias_columns()
  decoder.projection.bias = never_generated + (0.0 if output_bias is None else
                                               np.asarray(output_bias, np.float32))
  if pre_norm:
    _norm(encoder.layer_norm, model.encoder.final_norm.norm)
    _norm(decoder.layer_norm, model.decoder.final_norm.norm)

  spec.config.add_source_eos = True
  spec.config.layer_norm_epsilon = args["layer_norm_epsilon"]
  spec.register_source_vocabulary(source_pieces)
  spec.register_target_vocabulary(target_pieces)
  return spec
