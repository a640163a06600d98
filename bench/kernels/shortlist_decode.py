"""A direct XLA decode with and without a constant vocabulary shortlist (the SavedModel's gap).

    python -m bench.kernels.shortlist_decode [--size=1024]

Random small-preset model (3+3 layers, d_model 256, 8000 pieces), one random source of 20
pieces, 30 forced target tokens, `decoding.decode` under tf.function(jit_compile=True):
  - full: the whole vocabulary;
  - spread: decode(shortlist=...), logits of the shortlist spread back over the vocabulary;
  - in_space: the search itself over the shortlist's indices (EOS first), ids mapped back.
Prints target tokens/s (best of 5) per beam and kind, two rounds.
"""

from absl import app, flags

flags.DEFINE_integer("size", 1024, "Shortlist size.")
FLAGS = flags.FLAGS


def main(argv):
  import time

  import numpy as np
  import tensorflow as tf

  from data_pipeline.token_ids import BOS_ID, EOS_ID
  from tf_transformer.decoding import beam_search
  from tf_transformer import decoding
  from tf_transformer.config import DecodeConfig, ModelConfig
  from tf_transformer.model import build_model

  vocab, length = 8000, 30
  model = build_model(ModelConfig(vocab, vocab, num_layers=3, d_model=256, num_heads=8,
                                  d_ff=1024))
  rng = np.random.default_rng(0)
  source = tf.constant([list(rng.integers(4, vocab, 20)) + [EOS_ID]], tf.int32)
  shortlist = tf.constant([[EOS_ID] + list(rng.choice(np.arange(4, vocab), FLAGS.size - 1,
                                                      replace=False))], tf.int32)  # [1, n]

  def in_space(ids, beam):
    memory, cross_bias = model.encode(ids, training=False)
    cache = model.init_decode_cache(memory, length, output_ids=shortlist)
    forbidden = tf.gather(decoding.never_generated_bias(vocab), shortlist)

    def logits_fn(tokens, step, self_cache):
      vocab_ids = tf.where(step == 0, BOS_ID, tf.gather(shortlist[0], tokens))
      logits, new = model.decode_step(vocab_ids, step, cross_bias, dict(cache, self=self_cache),
                                      logits_bias=forbidden)
      return logits, new["self"]

    out, scores = beam_search.beam_search(logits_fn, tf.zeros([1], tf.int32), cache["self"],
                                          beam, 0.6, length, 0, length, length)
    return tf.gather(shortlist[0], out), scores

  def search(beam):
    return DecodeConfig(beam_size=beam, alpha=0.6, min_decode_length=length,
                        max_decode_length=length)

  kinds = {
      "full": lambda ids, beam: decoding.decode(model, ids, search(beam)),
      "spread": lambda ids, beam: decoding.decode(model, ids, search(beam), shortlist=shortlist),
      "in_space": in_space,
  }
  for beam in (4, 1):
    for _ in range(2):
      for name, fn in kinds.items():
        run = tf.function(lambda ids, fn=fn, beam=beam: fn(ids, beam)[0], jit_compile=True)
        run(source).numpy()
        best = float("inf")
        for _ in range(5):
          began = time.perf_counter()
          run(source).numpy()
          best = min(best, time.perf_counter() - began)
        print(f"beam {beam} {name:9s} {length / best:7.0f} target tokens/s", flush=True)


if __name__ == "__main__":
  app.run(main)
