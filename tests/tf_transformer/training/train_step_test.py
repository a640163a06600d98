"""The training step's equalities: micro-batches, replicas and XLA change nothing but speed."""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_pipeline.pipeline import add_decoder_inputs
from tests import testutil
from tf_transformer.training import losses, train_step
from tf_transformer.training.optimizer import make_optimizer
from tf_transformer.training.train_step import make_train_step
from tf_transformer.config import ModelConfig, TrainConfig
from tf_transformer.model import Transformer

VOCAB = 30
MODEL = ModelConfig(VOCAB, VOCAB, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                    dropout_rate=0.0, attention_dropout_rate=0.0, relu_dropout_rate=0.0)


def make_batch(seed, rows, length):
  """(source_ids, target_input_ids, target_ids) [rows, length] with ragged real lengths."""
  rng = np.random.default_rng(seed)
  source = rng.integers(4, VOCAB, (rows, length)).astype(np.int32)
  target = rng.integers(4, VOCAB, (rows, length)).astype(np.int32)
  for row in range(rows):
    source[row, rng.integers(2, length + 1):] = 0
    cut = rng.integers(2, length + 1)
    target[row, cut - 1], target[row, cut:] = 3, 0
  return tuple(t.numpy() for t in add_decoder_inputs(tf.constant(source), tf.constant(target)))


def train(batches, update_freq=1, steps=3, jit_compile=False, dtype=None, rdrop_alpha=None,
          model_config=MODEL):
  """Weights after `steps` updates on the endless cycle of `batches`, and the last stats. XLA
  needs static shapes: under `jit_compile` the model computes padded rows too. rdrop_alpha None:
  make_train_step's default."""
  keras.utils.set_random_seed(0)
  config = dataclasses.replace(model_config, skip_padding=not jit_compile)
  model = Transformer(**config.__dict__, dtype=dtype)
  optimizer = make_optimizer(MODEL, TrainConfig(model_dir="", warmup_steps=4))
  optimizer.build(model.trainable_variables)
  dataset = tf.data.Dataset.from_tensors(batches[0])
  for batch in batches[1:]:
    dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
  iterator = iter(dataset.repeat())
  rdrop = {} if rdrop_alpha is None else {"rdrop_alpha": rdrop_alpha}
  step = make_train_step(model, optimizer, tf.distribute.get_strategy(), 0.1,
                                 update_freq, jit_compile, **rdrop)
  stats = None
  for _ in range(steps):
    stats = step(iterator)
  return [w.numpy() for w in model.weights], stats


def concat(*batches):
  return tuple(np.concatenate(parts) for parts in zip(*batches))


def test_accumulated_micro_batches_equal_one_big_batch():
  a, b, c = make_batch(1, 3, 7), make_batch(2, 2, 7), make_batch(3, 4, 7)
  accumulated, stats = train([a, b, c], update_freq=3)
  big, big_stats = train([concat(a, b, c)], update_freq=1)
  assert float(stats["tokens"]) == float(big_stats["tokens"])
  np.testing.assert_allclose(float(stats["loss"]), float(big_stats["loss"]), rtol=1e-5)
  assert stats["shapes"].numpy().tolist() == [[3, 7], [2, 7], [4, 7]]
  for got, expected in zip(accumulated, big):
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_static_shape_statistics_equal_gathered_ones():
  keras.utils.set_random_seed(0)
  model = Transformer(**MODEL.__dict__)
  static_model = Transformer(**dataclasses.replace(MODEL, skip_padding=False).__dict__)
  static_model.set_weights(model.get_weights())
  batch = tuple(tf.constant(t) for t in make_batch(4, 3, 9))
  gathered = losses.batch_statistics(model, batch, 0.1, training=False)
  static = losses.batch_statistics(static_model, batch, 0.1, training=False)
  assert float(static["tokens"]) < int(tf.size(batch[2]))  # the batch has padding
  for key in gathered:
    np.testing.assert_allclose(float(static[key]), float(gathered[key]), rtol=1e-5)


@pytest.mark.parametrize("shared_vocab", [True, False])
def test_training_statistics_fuse_the_loss_without_changing_it(shared_vocab):
  """With dropout off, training=True (projection and loss fused by chunks, gradient formed in
  the forward pass) gives the statistics and gradients of training=False (plain autodiff)."""
  keras.utils.set_random_seed(0)
  model = Transformer(**dataclasses.replace(MODEL, shared_vocab=shared_vocab).__dict__)
  batch = tuple(tf.constant(t) for t in make_batch(4, 5, 9))

  @tf.function
  def statistics_and_gradients(training):
    with tf.GradientTape() as tape:
      stats = losses.batch_statistics(model, batch, 0.1, training=training)
    return stats, tape.gradient(stats["loss"], model.trainable_variables)

  fused, fused_gradients = statistics_and_gradients(True)
  plain, plain_gradients = statistics_and_gradients(False)
  for key in plain:
    np.testing.assert_allclose(float(fused[key]), float(plain[key]), rtol=1e-5)
  # Both sum the same float32 terms in different orders: agree to float32 rounding.
  for got, expected in zip(fused_gradients, plain_gradients):
    np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(),
                               tf.convert_to_tensor(expected).numpy(), rtol=1e-5, atol=1e-6)


def test_xla_compiled_step_equals_the_graph_step():
  batches = [make_batch(5, 3, 8), make_batch(6, 3, 12)]
  compiled, _ = train(batches, jit_compile=True)
  graph, _ = train(batches)
  for got, expected in zip(compiled, graph):
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_rdrop_off_passes_each_batch_once_and_trains_bit_for_bit_as_before(monkeypatch):
  """--rdrop_alpha=0 (the default): the model sees each batch once, and the weights are those
  of a step built without the argument, bit for bit (dropout on); R-Drop's passes are one batch
  of twice the rows."""
  rows = []
  encode_rows = Transformer.encode_rows

  def recording(self, source_ids, **kwargs):
    rows.append(source_ids.shape[0])
    return encode_rows(self, source_ids, **kwargs)

  monkeypatch.setattr(Transformer, "encode_rows", recording)
  with_dropout = dataclasses.replace(MODEL, dropout_rate=0.3)
  batches = [make_batch(1, 3, 7)]
  before, before_stats = train(batches, model_config=with_dropout)
  assert set(rows) == {3} and "rdrop_kl" not in before_stats
  rows.clear()
  off, _ = train(batches, rdrop_alpha=0.0, model_config=with_dropout)
  assert set(rows) == {3}
  for got, expected in zip(off, before):
    np.testing.assert_array_equal(got, expected)
  rows.clear()
  train(batches, rdrop_alpha=1.0, model_config=with_dropout)
  assert set(rows) == {6}


def test_rdrop_passes_see_dropout_masks_of_their_own():
  """Under dropout the two passes' distributions differ (a divergence > 0); without it they
  are the same model on the same batch: no divergence, and the statistics and training of one
  pass."""
  batches = [make_batch(2, 4, 9)]
  _, stats = train(batches, steps=1, rdrop_alpha=1.0,
                   model_config=dataclasses.replace(MODEL, dropout_rate=0.3))
  assert float(stats["rdrop_kl"]) > 1e-3 * float(stats["tokens"])
  weights, stats = train(batches, rdrop_alpha=1.0)
  plain_weights, plain_stats = train(batches)
  assert float(stats["rdrop_kl"]) == pytest.approx(0.0, abs=1e-6)
  for key in plain_stats:
    if key != "shapes":
      np.testing.assert_allclose(float(stats[key]), float(plain_stats[key]), rtol=1e-5)
  for got, expected in zip(weights, plain_weights):
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_rdrop_accumulated_xla_and_reduced_precision_steps():
  """R-Drop under gradient accumulation (the sums of one big batch), XLA's static shapes (the
  unfused loss: the graph step's), mixed bfloat16 (finite) and loss-scaled float16."""
  a, b = make_batch(1, 3, 7), make_batch(2, 2, 7)
  accumulated, stats = train([a, b], update_freq=2, rdrop_alpha=2.0)
  big, big_stats = train([concat(a, b)], rdrop_alpha=2.0)
  for key in ("loss", "nll", "tokens", "rdrop_kl"):
    np.testing.assert_allclose(float(stats[key]), float(big_stats[key]), rtol=1e-5, atol=1e-6)
  for got, expected in zip(accumulated, big):
    np.testing.assert_allclose(got, expected, atol=1e-5)
  compiled, _ = train([a], jit_compile=True, rdrop_alpha=2.0)
  graph, _ = train([a], rdrop_alpha=2.0)
  # (seen: 1.3e-4 at most, Adam's normalisation of near-zero gradient entries summed in other
  # orders; a wrong loss moves weights by about the learning rate, 3e-2 at step 1)
  for got, expected in zip(compiled, graph):
    np.testing.assert_allclose(got, expected, atol=5e-4)
  with_dropout = dataclasses.replace(MODEL, dropout_rate=0.3)
  for dtype in ("mixed_bfloat16", "mixed_float16"):
    weights, stats = train([a], dtype=dtype, rdrop_alpha=2.0, model_config=with_dropout)
    assert np.isfinite(float(stats["loss"])) and float(stats["rdrop_kl"]) > 0, dtype
    assert all(np.isfinite(w).all() for w in weights), dtype


def test_mixed_bfloat16_step_is_finite_and_float32_where_it_counts():
  keras.utils.set_random_seed(0)
  model = Transformer(**MODEL.__dict__, dtype="mixed_bfloat16")
  assert all(w.dtype == "float32" for w in model.weights)
  batch = tuple(tf.constant(t) for t in make_batch(7, 3, 8))
  memory, bias = model.encode(batch[0])
  assert memory.dtype == tf.bfloat16
  assert model.logits(model.decode(batch[1], memory, bias)).dtype == tf.float32
  before, _ = train([make_batch(7, 3, 8)], steps=0, dtype="mixed_bfloat16")
  after, stats = train([make_batch(7, 3, 8)], steps=3, dtype="mixed_bfloat16")
  assert np.isfinite(float(stats["loss"]))
  assert all(np.isfinite(w).all() for w in after)
  assert any(not np.array_equal(a, b) for a, b in zip(before, after))


def test_loss_scaled_float16_step_updates_finite_weights():
  config = TrainConfig(model_dir="", warmup_steps=4, mixed_precision="mixed_float16")
  keras.utils.set_random_seed(0)
  model = Transformer(**MODEL.__dict__, dtype="mixed_float16")
  optimizer = make_optimizer(MODEL, config)
  assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
  optimizer.build(model.trainable_variables)
  before = [w.numpy() for w in model.trainable_variables]
  iterator = iter(tf.data.Dataset.from_tensors(make_batch(8, 3, 8)).repeat())
  step = make_train_step(model, optimizer, tf.distribute.get_strategy(), 0.1)
  for _ in range(3):
    stats = step(iterator)
  assert np.isfinite(float(stats["loss"]))
  after = [w.numpy() for w in model.trainable_variables]
  assert all(np.isfinite(w).all() for w in after)
  assert any(not np.array_equal(a, b) for a, b in zip(before, after))


_MIRRORED = """
import json, sys
import numpy as np, keras, tensorflow as tf
from tf_transformer.config import ModelConfig, TrainConfig
from tf_transformer.training.optimizer import make_optimizer
from tf_transformer.runtime import set_up_runtime
from tf_transformer.training.train_step import make_train_step
from tf_transformer.model import Transformer

MODEL = ModelConfig(**json.loads(sys.argv[1]))
saved = np.load(sys.argv[2])
batches = [tuple(saved[f"{i}_{j}"] for j in range(3)) for i in range(len(saved.files) // 3)]

mirrored = set_up_runtime(TrainConfig(model_dir="", distribution="mirrored", num_cpu_devices=2))
assert mirrored.num_replicas_in_sync == 2

def run(strategy, batches, steps, clip_norm, rdrop_alpha):
  with strategy.scope():
    keras.utils.set_random_seed(0)
    model = Transformer(**MODEL.__dict__)
    optimizer = make_optimizer(MODEL, TrainConfig(model_dir="", warmup_steps=4))
    optimizer.build(model.trainable_variables)
  dataset = tf.data.Dataset.from_tensors(batches[0])
  for batch in batches[1:]:
    dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
  iterator = iter(dataset.repeat())
  step = make_train_step(model, optimizer, strategy, 0.1, clip_norm=clip_norm,
                         rdrop_alpha=rdrop_alpha)
  stats = [step(iterator) for _ in range(steps)]
  losses = [float(s["loss"]) for s in stats]
  norms = [float(s["grad_norm"]) for s in stats]
  clipped = [float(s["clipped"]) for s in stats]
  # Adam's first moments are linear in the gradients: they compare the gradients themselves
  # (its updates are sign(g)-like at first, so a rounding difference of a near-zero gradient
  # entry moves a weight by up to the learning rate)
  momentums = [v.numpy() for v in optimizer.variables if "momentum" in v.path]
  assert len(momentums) == len(model.trainable_variables)
  return [w.numpy() for w in model.weights], momentums, losses, norms, clipped

# clipped at every step: the norm of the replicas' sum decides, not each replica's part;
# without and with R-Drop (its divergence is 0 with the model's dropout off, its two passes
# split over the replicas as the batch's rows)
difference = lambda a, b: max(float(np.abs(x - y).max()) for x, y in zip(a, b))
reports = []
for rdrop_alpha in (0.0, 1.5):
  single = run(tf.distribute.get_strategy(), batches, 3, 0.05, rdrop_alpha)
  replicated = run(mirrored, batches, 3, 0.05, rdrop_alpha)
  reports.append({
      "max_weight_diff": difference(single[0], replicated[0]),
      "max_momentum_diff": difference(single[1], replicated[1]),
      "max_momentum": max(float(np.abs(m).max()) for m in single[1]),
      "single_losses": single[2], "mirrored_losses": replicated[2],
      "single_norms": single[3], "mirrored_norms": replicated[3],
      "single_clipped": single[4], "mirrored_clipped": replicated[4]})
print(json.dumps(reports))
"""


def test_mirrored_step_equals_single_device_step(tmp_path):
  """Two logical CPUs (a separate process: devices are fixed once TensorFlow starts)."""
  # uneven splits: 3 rows (1 + 2), 1 row (0 + 1: an empty replica), 5 rows of another length
  batches = [make_batch(1, 3, 7), make_batch(2, 1, 7), make_batch(3, 5, 11)]
  np.savez(tmp_path / "batches.npz", **{f"{i}_{j}": part for i, batch in enumerate(batches)
                                        for j, part in enumerate(batch)})
  result = testutil.run_python(_MIRRORED, json.dumps(MODEL.__dict__),
                               str(tmp_path / "batches.npz"))
  assert result.returncode == 0, result.stderr
  reports = json.loads(result.stdout.strip().splitlines()[-1])
  assert len(reports) == 2  # without and with R-Drop
  for report in reports:
    assert report["max_momentum_diff"] < 1e-4 * report["max_momentum"]  # float32 sums
    # the product's Adam on the Noam schedule: each weight moves by at most ~lr a step
    assert report["max_weight_diff"] < 1e-3
    # the summed loss of each batch does not depend on how its rows split over replicas
    np.testing.assert_allclose(report["mirrored_losses"], report["single_losses"], rtol=1e-5)
    assert all(np.isfinite(report["mirrored_losses"]))
    np.testing.assert_allclose(report["mirrored_norms"], report["single_norms"], rtol=1e-4)
    assert report["single_clipped"] == report["mirrored_clipped"] == [1.0, 1.0, 1.0]


def _overflowing_model_and_batches(update_freq=1, ema_decay=0.0):
  """A model whose embedding row of one token is finite but overflows the forward pass, and
  a batch with that token (a non-finite loss) beside batches without it."""
  keras.utils.set_random_seed(0)
  config = dataclasses.replace(MODEL, shared_vocab=False)  # the poison stays out of the logits
  model = Transformer(**config.__dict__)
  optimizer = make_optimizer(config, TrainConfig(model_dir="", warmup_steps=4,
                                                 ema_decay=ema_decay))
  optimizer.build(model.trainable_variables)
  poison = VOCAB - 1
  embedding = model.source_embedding.embeddings
  embedding.assign(tf.tensor_scatter_nd_update(embedding, [[poison]],
                                               tf.fill([1, MODEL.d_model], 3e38)))
  clean = [np.where(part == poison, 4, part) for part in make_batch(9, 3, 8)]
  poisoned = [part.copy() for part in clean]
  poisoned[0][0, 0] = poison
  batches = [tuple(clean)] * update_freq + [tuple(poisoned)] * update_freq
  iterator = iter(tf.data.Dataset.from_tensor_slices(
      tuple(np.stack(parts) for parts in zip(*batches))))
  return model, optimizer, make_train_step(model, optimizer, tf.distribute.get_strategy(), 0.1,
                                           update_freq), iterator


@pytest.mark.parametrize("update_freq, ema_decay", [(1, 0.0), (2, 0.0), (1, 0.9)])
def test_non_finite_step_applies_no_update(update_freq, ema_decay):
  """Nor to the optimizer's variables: Adam's moments, and with --ema_decay the moving average
  of the weights."""
  model, optimizer, step, iterator = _overflowing_model_and_batches(update_freq, ema_decay)
  averages = [v for v in optimizer.variables if "average" in v.path]
  assert len(averages) == (len(model.trainable_variables) if ema_decay else 0)
  stats = step(iterator)  # the clean batch(es)
  assert float(stats["finite"]) == 1.0 and int(optimizer.iterations.numpy()) == 1
  before = [v.numpy() for v in model.weights + optimizer.variables]
  stats = step(iterator)  # the poisoned one(s)
  assert not np.isfinite(float(stats["loss"]))
  assert float(stats["finite"]) == 0.0
  assert int(optimizer.iterations.numpy()) == 1
  for got, expected in zip([v.numpy() for v in model.weights + optimizer.variables], before):
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shared_vocab", [True, False])  # False: a sparse embedding gradient
@pytest.mark.parametrize("clip_factor", [0.5, 2.0])
def test_gradient_norm_and_clipping_match_a_float64_reference(shared_vocab, clip_factor):
  """One step: the reported norm is that of the token-averaged gradient, and Adam's first
  moment (0.1 * gradient after one step) holds the gradient scaled to --clip_norm when the
  norm exceeds it, untouched otherwise."""
  config = dataclasses.replace(MODEL, shared_vocab=shared_vocab)
  batch = tuple(tf.constant(t) for t in make_batch(10, 4, 9))
  keras.utils.set_random_seed(0)
  model = Transformer(**config.__dict__)
  model(batch[:2])
  with tf.GradientTape() as tape:
    stats = losses.batch_statistics(model, batch, 0.1)
  reference = [tf.convert_to_tensor(g).numpy().astype(np.float64) / float(stats["tokens"])
               for g in tape.gradient(stats["loss"], model.trainable_variables)]
  norm = np.sqrt(sum(float(np.sum(g * g)) for g in reference))
  clip_norm = clip_factor * norm
  expected = [g * min(1.0, clip_norm / norm) for g in reference]

  optimizer = make_optimizer(config, TrainConfig(model_dir="", warmup_steps=4))
  optimizer.build(model.trainable_variables)
  step = make_train_step(model, optimizer, tf.distribute.get_strategy(), 0.1,
                         clip_norm=clip_norm)
  stats = step(iter(tf.data.Dataset.from_tensors(batch).repeat()))
  np.testing.assert_allclose(float(stats["grad_norm"]), norm, rtol=1e-5)
  assert float(stats["clipped"]) == (1.0 if clip_factor < 1 else 0.0)
  momentums = [v.numpy() for v in optimizer.variables if "momentum" in v.path]
  for momentum, gradient in zip(momentums, expected):
    # float32 sums: an element's error scales with its tensor's largest terms, not with itself
    # (an element near zero by cancellation misses any relative bound)
    np.testing.assert_allclose(momentum, 0.1 * gradient, rtol=1e-4,
                               atol=1e-6 * np.abs(0.1 * gradient).max())


def test_global_norm_sums_the_repeated_rows_of_a_sparse_gradient():
  """Under MirroredStrategy an embedding's gradient stays IndexedSlices, one row per token
  occurrence: its norm is that of the dense sum, not of the rows."""
  rows = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]])
  sparse = tf.IndexedSlices(tf.constant(rows, tf.float32), tf.constant([4, 1, 4]),
                            tf.constant([6, 2]))
  dense = np.zeros((6, 2))
  np.add.at(dense, [4, 1, 4], rows)
  other = np.array([[2.0, -3.0]])
  expected = np.sqrt(np.sum(dense**2) + np.sum(other**2))
  norm = train_step._global_norm([sparse, tf.constant(other, tf.float32)])
  np.testing.assert_allclose(float(norm), expected, rtol=1e-6)
