"""Multi-head scaled dot-product attention with an additive bias and a key/value cache."""

import keras
import tensorflow as tf

from tf_transformer.layers.precisions import Float32Kernel
from tf_transformer.layers.dropout import Dropout
from tf_transformer.layers.token_layout import TokenLayout


@keras.saving.register_keras_serializable(package="tf_transformer")
class MultiHeadAttention(keras.layers.Layer):
  """Multi-head attention, "Attention Is All You Need" sections 3.2.1-3.2.2.

  Self-attention projects queries, keys and values with one fused [d_model, 3 * d_model]
  matmul; cross-attention projects the query alone and keys/values from `memory` with one
  [d_model, 2 * d_model] matmul. Projections have no bias, as in the reference implementation,
  unless `use_bias` (Marian's and fairseq's models have them): a bias of each projection's
  columns, added before the query's scaling.

  With `max_relative_position` K > 0 (self-attention only), relative position representations
  (Shaw et al., 2018): two learned tables [2K + 1, D], shared by the heads, of the key-minus-query
  distances clipped to [-K, K], added to the keys in the dot products and to the values in the
  weighted sum. The layer then sees no absolute position.

  Sizes: B batch, T query length, S key length, H heads, D = d_model / H.
  """

  def __init__(self, num_heads: int, dropout_rate: float = 0.0, self_attention: bool = True,
               max_relative_position: int = 0, use_bias: bool = False, **kwargs):
    super().__init__(**kwargs)
    if max_relative_position and not self_attention:
      raise ValueError("relative positions are for self-attention only")
    self.num_heads = num_heads
    self.dropout_rate = dropout_rate
    self.self_attention = self_attention
    self.max_relative_position = max_relative_position
    self.use_bias = use_bias
    # {kernel name: its bias variable [columns]}, with use_bias
    self.biases = {}
    self._dropout = Dropout(dropout_rate, dtype=self.dtype_policy)
    # {weight name: precisions.Kernel}: the products' weights (precisions.convert replaces
    # them with reduced-precision copies for inference)
    self.kernels = {}

  def build(self, query_shape, memory_shape=None):
    d_model = query_shape[-1]
    if d_model % self.num_heads:
      raise ValueError(f"d_model {d_model} is not divisible by num_heads {self.num_heads}")
    self.d_model = d_model
    init = keras.initializers.GlorotUniform()
    if self.self_attention:
      self.qkv_kernel = self.add_weight(name="qkv_kernel", shape=(d_model, 3 * d_model),
                                        initializer=init)
    else:
      self.q_kernel = self.add_weight(name="q_kernel", shape=(d_model, d_model), initializer=init)
      self.kv_kernel = self.add_weight(name="kv_kernel", shape=(d_model, 2 * d_model),
                                       initializer=init)
    self.output_kernel = self.add_weight(name="output_kernel", shape=(d_model, d_model),
                                         initializer=init)
    if self.max_relative_position:
      shape = (2 * self.max_relative_position + 1, d_model // self.num_heads)
      self.relative_keys = self.add_weight(name="relative_keys", shape=shape, initializer=init)
      self.relative_values = self.add_weight(name="relative_values", shape=shape,
                                             initializer=init)
    self.kernels = {name: Float32Kernel(variable)
                    for name, variable in self.kernels_for_inference().items()}
    if self.use_bias:
      for name, kernel in self.kernels_for_inference().items():
        bias_name = name.replace("kernel", "bias")
        # an attribute each, as the kernels: tf.train.Checkpoint saves what attributes hold
        setattr(self, bias_name, self.add_weight(name=bias_name, shape=(kernel.shape[1],),
                                                 initializer="zeros"))
        self.biases[name] = getattr(self, bias_name)

  def kernels_for_inference(self) -> dict:
    """The weight matrices by name (see precisions.convert)."""
    names = ("qkv_kernel",) if self.self_attention else ("q_kernel", "kv_kernel")
    return {name: getattr(self, name) for name in names + ("output_kernel",)}

  def _query_scale(self):
    """D**-0.5, the scale of the dot products, on the query columns of qkv_kernel or q_kernel:
    float32 [3 * d_model] (1 on the key and value columns) or a scalar.

    Applied to the kernel (d_model x columns multiplications instead of one per query element
    and position, and as many again in the backward pass). A cached decoding step has one
    query position a row, fewer than the kernel's entries: it scales the query instead
    (`_scaled_query`)."""
    scale = (self.d_model // self.num_heads)**-0.5
    if self.self_attention:
      return tf.concat([tf.fill([self.d_model], scale), tf.ones([2 * self.d_model])], axis=0)
    return tf.constant(scale)

  def _scaled_query(self, query):
    """query [B, H, T, D] times D**-0.5."""
    return query * tf.cast((self.d_model // self.num_heads)**-0.5, query.dtype)

  def _matmul(self, rows, layout, name, scale_query=False):
    """rows [R, d_model] of `layout` @ the weight `name` (+ its bias) -> [R, columns], in the
    compute dtype; its query columns times D**-0.5 with `scale_query`."""
    scale = self._query_scale() if scale_query else None
    bias = self.biases.get(name)
    if bias is not None and scale is not None:
      bias = bias * scale
    return self.kernels[name].matmul(rows, bias, column_scale=scale,
                                     static_rows=not layout.skip_padding)

  def _project(self, rows, layout, name, parts, scale_query=False):
    """rows [R, d_model] of `layout` @ the weight `name` [d_model, parts * d_model] ->
    `parts` tensors [B, H, T, D]."""
    y = layout.to_padded(self._matmul(rows, layout, name, scale_query))
    y = tf.reshape(y, [layout.batch, layout.length, parts, self.num_heads,
                       self.d_model // self.num_heads])
    y = tf.transpose(y, [2, 0, 3, 1, 4])  # -> [parts, B, H, T, D]
    return tf.unstack(y, num=parts, axis=0)

  def project_memory(self, memory):
    """Keys and values of cross-attention, computed once per source.

    Args:
      memory: [B, S, d_model] encoder output.

    Returns:
      dict with "key" and "value", each [B, H, S, D].
    """
    shape = tf.shape(memory)
    key, value = self._project(tf.reshape(memory, [-1, self.d_model]),
                               TokenLayout.dense(shape[0], shape[1]), "kv_kernel", 2)
    return {"key": key, "value": value}

  def relative_embeddings(self, query_positions, key_positions):
    """The relative position representations of each (query, key) pair (a layer with
    max_relative_position K).

    Args:
      query_positions: int32 [T]; key_positions: int32 [S].

    Returns:
      (keys, values), each [T, S, D] in the compute dtype: the rows of the tables at
      clip(key position - query position, -K, K) + K.
    """
    limit = self.max_relative_position
    distance = key_positions[tf.newaxis, :] - query_positions[:, tf.newaxis]  # -> [T, S]
    rows = tf.clip_by_value(distance, -limit, limit) + limit
    return tuple(tf.gather(tf.cast(table, self.compute_dtype), rows)
                 for table in (self.relative_keys, self.relative_values))

  def _relative(self, query, key_length, step=0):
    """`relative_embeddings` for query [B, H, T, D] at positions step.. over keys 0..S-1."""
    if not self.max_relative_position:
      return None
    return self.relative_embeddings(step + tf.range(tf.shape(query)[2]), tf.range(key_length))

  def _attend(self, query, key, value, bias, training, relative=None):
    """query [B, H, T, D] (already scaled by D**-0.5), key/value [B, H, S, D], bias
    broadcastable to [B, H, T, S]; relative: None or `relative_embeddings`' (keys, values)
    [T, S, D], added to every head's keys and values.

    Returns the context [B, H, T, D] and the attention weights float32 [B, H, T, S].
    """
    logits = tf.matmul(query, key, transpose_b=True)  # -> [B, H, T, S]
    if relative is not None:
      logits += tf.einsum("bhtd,tsd->bhts", query, relative[0])
    # softmax in float32: its exp/sum loses too much in float16/bfloat16
    weights = tf.nn.softmax(tf.cast(logits, tf.float32) + tf.cast(bias, tf.float32))
    dropped = self._dropout(tf.cast(weights, self.compute_dtype), training=training)
    context = tf.matmul(dropped, value)
    if relative is not None:
      context += tf.einsum("bhts,tsd->bhtd", dropped, relative[1])
    return context, weights

  def _output(self, context, layout):
    """context [B, H, T, D] -> rows [R, d_model] of `layout`, the heads concatenated and
    projected."""
    if context.shape[2] != 1:  # with one query position (a decoding step) it is a reshape
      context = tf.transpose(context, [0, 2, 1, 3])
    context = layout.to_rows(tf.reshape(context, [layout.batch, layout.length, self.d_model]))
    return self._matmul(context, layout, "output_kernel")

  def _queries_keys_values(self, query, layout, memory, memory_layout):
    """Projects query rows [R, d_model] and, for cross-attention, memory rows [M, d_model]:
    returns query [B, H, T, D] and key/value [B, H, T or S, D]."""
    if self.self_attention:
      return self._project(query, layout, "qkv_kernel", 3, scale_query=True)
    key, value = self._project(memory, memory_layout, "kv_kernel", 2)
    return self._project(query, layout, "q_kernel", 1, scale_query=True)[0], key, value

  def call(self, query, bias, layout, memory=None, memory_layout=None, cache=None,
           step=None, training=None):
    """Attends from `query` to itself (self-attention) or to `memory` (cross-attention).

    Args:
      query: rows [R, d_model] of `layout` over [B, T] (see TokenLayout).
      bias: float [B or 1, 1, T or 1, S]; added to the attention logits.
      layout: the TokenLayout of `query`.
      memory: rows [M, d_model] of the encoder output, in `memory_layout` over [B, S];
        cross-attention only, unless `cache` holds its projected keys and values.
      cache: optional dict of decoding state. Self-attention: "key"/"value" buffers
        [B, H, buffer_length, D] into which the T new keys/values are written at `step`.
        Cross-attention: the output of `project_memory` for B / K sources, where each source
        is shared by K consecutive queries (the hypotheses of a beam); the keys and values are
        used as they are, never copied per query.
      step: int32 scalar, the position of query[:, 0] (with a self-attention cache).
      training: enables attention dropout.

    Returns:
      (output rows [R, d_model], cache): the cache with the new keys/values written
      (self-attention), as given (cross-attention), or None when called without one. The
      attention weights come from `attention_weights`.
    """
    if cache is None:
      query, key, value = self._queries_keys_values(query, layout, memory, memory_layout)
      context, _ = self._attend(query, key, value, bias, training,
                                self._relative(query, tf.shape(key)[2]))
    elif self.self_attention:
      query, key, value = self._project(query, layout, "qkv_kernel", 3)
      cache = self._write_cache(cache, key, value, step)
      context, _ = self._attend(self._scaled_query(query), cache["key"], cache["value"], bias,
                                training, self._relative(query, tf.shape(cache["key"])[2], step))
    else:
      query = self._scaled_query(self._project(query, layout, "q_kernel", 1)[0])
      context = self._attend_shared(query, cache["key"], cache["value"], bias, training)
    return self._output(context, layout), cache

  def attention_weights(self, query, bias, layout, memory=None, memory_layout=None):
    """The attention weights of `call` without a cache, in inference (no dropout).

    Args: as `call`.

    Returns:
      float32 [B, H, T, S]; each row sums to 1 over the keys the bias leaves visible.
    """
    query, key, value = self._queries_keys_values(query, layout, memory, memory_layout)
    return self._attend(query, key, value, bias, False,
                        self._relative(query, tf.shape(key)[2]))[1]

  def _attend_shared(self, query, key, value, bias, training):
    """`_attend`'s context for query [B * K, H, T, D] over key/value [B, H, S, D], bias
    [B, 1, 1, S]: [B * K, H, T, D].

    The K queries of one source are folded into its time axis ([B, H, K * T, D]): one matmul
    per source instead of K copies of its keys and values.
    """
    batch = tf.shape(key)[0]
    shared = tf.shape(query)[0] // batch
    _, heads, length, depth = tf.unstack(tf.shape(query))
    folded = tf.reshape(query, [batch, shared, heads, length, depth])
    folded = tf.reshape(tf.transpose(folded, [0, 2, 1, 3, 4]), [batch, heads, -1, depth])
    context, _ = self._attend(folded, key, value, bias, training)
    context = tf.reshape(context, [batch, heads, shared, length, depth])
    context = tf.reshape(tf.transpose(context, [0, 2, 1, 3, 4]),  # -> [B, K, H, T, D]
                         [batch * shared, heads, length, depth])
    context.set_shape(query.shape)
    return context

  @staticmethod
  def _write_cache(cache, key, value, step):
    """Returns the buffers with key/value [B, H, T, D] written at time `step`.

    The buffers keep a static shape so that a decoding loop compiles once (also under XLA);
    the caller's bias hides the positions not written yet. The scatter touches only the
    B * H * T * D new entries (TensorFlow updates the buffer in place when it can).
    """
    batch, heads, length = tf.unstack(tf.shape(key)[:3])
    b, h, t = tf.meshgrid(tf.range(batch), tf.range(heads), step + tf.range(length),
                          indexing="ij")
    indices = tf.stack([b, h, t], axis=-1)  # -> [B, H, T, 3]
    return {"key": tf.tensor_scatter_nd_update(cache["key"], indices, key),
            "value": tf.tensor_scatter_nd_update(cache["value"], indices, value)}

  def compute_output_shape(self, query_shape, *args, **kwargs):
    return query_shape

  def get_config(self):
    config = super().get_config()
    config.update(num_heads=self.num_heads, dropout_rate=self.dropout_rate,
                  self_attention=self.self_attention,
                  max_relative_position=self.max_relative_position, use_bias=self.use_bias)
    return config
