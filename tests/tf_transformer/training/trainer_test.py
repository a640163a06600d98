"""Training end to end on a synthetic task: it learns, and its checkpoints and TensorBoard hold
what they should (a resumed run equals an unbroken one: bin/train_kill_test.py)."""

import math
import random

import numpy as np
import tensorflow as tf

from tests import testutil
from tf_transformer import checkpoints, runtime
from tf_transformer.training import run as run_lib
from tf_transformer.training import trainer
from tf_transformer.bin import shared_flags

WORDS = [chr(ord("a") + i) * 2 for i in range(20)]  # "aa" .. "tt": one subword piece each


def write_reversal_corpus(folder, seed=0, sizes=(("train", 3000), ("val", 100), ("test", 50)),
                          target_word=lambda word: word):
  """Source: 2-8 random words; target: the same words reversed, each as `target_word` spells
  it. Splits never share a seed."""
  rng = random.Random(seed)
  for split, count in sizes:
    sentences = [[rng.choice(WORDS) for _ in range(rng.randint(2, 8))] for _ in range(count)]
    testutil.write_corpus(folder, split, [" ".join(words) for words in sentences],
                          [" ".join(map(target_word, reversed(words))) for words in sentences])


def build_trainer(data_dir, model_dir, *args):
  from data_pipeline.parallel_data import ParallelData
  testutil.parse_flags("tiny", f"--data_dir={data_dir}", f"--model_dir={model_dir}",
                       "--src_lang=src", "--tgt_lang=tgt", *args)
  train_config = shared_flags.train_config_from_flags()
  strategy = runtime.set_up_runtime(train_config)
  data = ParallelData(shared_flags.data_config_from_flags(), model_dir)
  model_config = shared_flags.model_config_from_flags(data.vocabulary.source_size,
                                                 data.vocabulary.target_size)
  return run_lib.create_trainer(data, model_config, train_config,
                                shared_flags.decode_config_from_flags(), strategy)


def test_a_tiny_model_learns_to_reverse_and_tensorboard_shows_each_evaluation(reversal_model):
  """conftest's reversal_model (flags/tiny.cfg, 300 steps, evaluations every 100): its test
  translations are mostly exact, and TensorBoard holds the training curves and, at each
  evaluation, the dev scores, the first four dev sentences' translations and the attention
  heat maps of the first two."""
  model_dir, dev, results = reversal_model
  folder = model_dir.parent
  references = (folder / "test.tgt").read_text().splitlines()
  hypotheses = (model_dir / "test_hypotheses.txt").read_text().splitlines()
  correct = sum(h == r for h, r in zip(hypotheses, references))
  # seen: BLEU 85.6, 24 of 30 exact (a random model: BLEU 0, none)
  assert len(hypotheses) == len(references) == 30 and correct >= 0.6 * 30, correct
  assert results["test_bleu"] > 70, results
  assert {"loss", "accuracy", "perplexity", "learning_rate", "tokens_per_sec", "grad_norm",
          "clip_fraction"} <= set(summaries(model_dir / "train"))
  logged = summaries(model_dir / "eval")
  assert {"loss", "perplexity", "accuracy", "bleu", "chrf", "eval_seconds",
          "translations"} <= set(logged)
  assert logged["accuracy"][-1][1] >= 0.9, logged["accuracy"]
  assert [step for step, _ in logged["translations"]] == [100, 200, 300]
  for _, text in logged["translations"]:
    shown = text.decode().split("\n\n")
    assert [entry.split("  \n")[:2] for entry in shown] == [
        [f"**source** {source}", f"**reference** {reference}"] for source, reference in dev[:4]]
  assert logged["test_bleu"] == [(300, np.float32(results["test_bleu"]))]
  assert logged["test_chrf"] == [(300, np.float32(results["test_chrf"]))]
  for tag in ("attention/1", "attention/2"):
    assert [step for step, _ in logged[tag]] == [100, 200, 300]
    image = tf.image.decode_png(logged[tag][-1][1])
    assert image.shape[0] >= 300 and image.shape[1] >= 400 and image.shape[2] == 4


def test_separate_vocabularies_learn_a_word_mapping(tmp_path):
  """Source and target words share no spelling, so each side needs its own subword model and
  the target can only come from reading the source (a source tokenized with the target's model
  would be all unknown pieces)."""
  spelling = {word: chr(ord("A") + (7 * i) % 20) + chr(ord("a") + i)
              for i, word in enumerate(WORDS)}  # "aa" -> "Aa", "bb" -> "Hb", ...
  write_reversal_corpus(tmp_path, sizes=(("train", 3000), ("val", 100)),
                        target_word=spelling.get)
  # float32, not the machine's auto precision: dev accuracy after the 800 steps moved between
  # 0.92 and 0.99 with rounding alone (bfloat16 gave 0.92). Here it is 0.98 with BLEU 94; a
  # source read with the target's subword model gave 0.86 and BLEU 75 (the decoder guesses
  # much of each target word from its first letter).
  run = build_trainer(tmp_path, tmp_path / "model", "--shared_vocab=false",
                      "--mixed_precision=float32")
  run.train()
  dev = run.evaluator.evaluate(run.step)
  assert dev["accuracy"] >= 0.92 and dev["bleu"] >= 85, dev


def test_checkpoint_holds_every_weight(tmp_path):
  import dataclasses

  import tensorflow as tf

  from tf_transformer import model_dir as model_dir_lib
  from tf_transformer.model import Transformer

  write_reversal_corpus(tmp_path, sizes=(("train", 200), ("val", 10)))
  run = build_trainer(tmp_path, tmp_path / "model", "--train_steps=2", "--dropout_rate=0.1",
                      "--save_every=1", "--keep_checkpoints=1", "--dev_prefix=")
  run.train()
  # --keep_checkpoints=1: step 1's checkpoint was deleted when step 2's was written
  assert sorted(path.name for path in (tmp_path / "model").glob("ckpt-*")) == [
      "ckpt-2.data-00000-of-00001", "ckpt-2.index"]
  fresh = Transformer(**dataclasses.asdict(model_dir_lib.read_config(str(tmp_path / "model"))))
  path = tf.train.latest_checkpoint(str(tmp_path / "model"))
  tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
  assert len(fresh.weights) == len(run.model.weights)
  for restored, trained in zip(fresh.weights, run.model.weights):
    np.testing.assert_array_equal(restored.numpy(), trained.numpy(), err_msg=trained.path)
  names = tf.train.load_checkpoint(path).get_variable_to_shape_map()
  assert any(n.startswith("iterator/") for n in names)
  assert any(n.startswith("dropout_states/") for n in names)


def record_step_statistics(run, name) -> list:
  """The list to which each step of `run` will append its statistic `name` (a float)."""
  recorded, step = [], run.train_step

  def recording(iterator):
    stats = step(iterator)
    recorded.append(float(stats[name]))
    return stats

  run.train_step = recording
  return recorded


def summaries(folder) -> dict:
  """{tag: [(step, value)]} of the TensorBoard event files of `folder`: a scalar's float32, an
  image's PNG bytes, a text's bytes."""
  found = {}
  for path in sorted(folder.glob("events.*")):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        tensor = tf.make_ndarray(value.tensor)
        data = tensor.reshape(-1)[-1] if value.metadata.plugin_data.plugin_name == "images" else (
            tensor.item() if tensor.size == 1 else tensor)
        found.setdefault(value.tag, []).append((event.step, data))
  return found


def test_gradient_norm_clip_fraction_and_profile_reach_tensorboard(tmp_path):
  write_reversal_corpus(tmp_path, sizes=(("train", 200), ("val", 10)))
  for name, clip_norm, expected in (("tight", 1e-6, 1.0), ("loose", 1e6, 0.0)):
    run = build_trainer(tmp_path, tmp_path / name, "--train_steps=3", f"--clip_norm={clip_norm}",
                        "--dev_prefix=", "--profile_steps=2,3")
    norms = record_step_statistics(run, "grad_norm")
    run.train()
    train = summaries(tmp_path / name / "train")
    assert train["clip_fraction"] == [(3, expected)]
    # the mean of the steps' norms before clipping (each checked against float64 in
    # train_step_test), written as float32
    assert len(norms) == 3 and all(norm > 0 for norm in norms)
    assert train["grad_norm"] == [(3, np.float32(sum(norms) / 3))]
    # --profile_steps: a trace for TensorBoard's Profile tab
    assert list((tmp_path / name / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))


def test_hyper_parameters_reach_the_hparams_plugin(tmp_path):
  """The run's folder holds the HParams session of its flags (its train/ and eval/ figures
  are the session's metrics when TensorBoard's --logdir is the parent folder)."""
  from tensorboard.plugins.hparams import plugin_data_pb2
  write_reversal_corpus(tmp_path, sizes=(("train", 200), ("val", 10)))
  build_trainer(tmp_path, tmp_path / "run_a", "--train_steps=1", "--d_model=32",
                "--dev_prefix=").train()
  [path] = (tmp_path / "run_a").glob("events.*")
  [content] = [value.metadata.plugin_data.content
               for event in tf.compat.v1.train.summary_iterator(str(path))
               for value in event.summary.value if value.tag == "_hparams_/session_start_info"]
  start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
  values = {name: getattr(value, value.WhichOneof("kind"))
            for name, value in start.hparams.items()}
  assert values["d_model"] == 32 and values["num_layers"] == 2 and values["beam_size"] == 4
  assert values["learning_rate"] == 0.5 and values["src_lang"] == "src"
  assert values["jit_compile"] is False


def test_loss_scale_reaches_tensorboard_under_mixed_float16(tmp_path):
  write_reversal_corpus(tmp_path, sizes=(("train", 200), ("val", 10)))
  run = build_trainer(tmp_path, tmp_path / "model", "--train_steps=2", "--dev_prefix=",
                      "--mixed_precision=mixed_float16")
  norms = record_step_statistics(run, "grad_norm")
  run.train()
  [(step, scale)] = summaries(tmp_path / "model" / "train")["loss_scale"]
  # Keras starts at 2^15 and halves the scale after each step whose scaled gradients
  # overflowed (their unscaled norm is then not finite); it grows only after 2,000 steps
  overflows = sum(not math.isfinite(norm) for norm in norms)
  assert len(norms) == 2 and step == 2 and scale == 2.0**15 / 2**overflows


def test_moving_average_of_the_weights(tmp_path):
  """--ema_decay=d: model_dir/ema holds e_1 = w_1, e_t = d e_(t-1) + (1 - d) w_t over the
  weights w_t after each step (read here from a checkpoint per step, averaged in float64),
  while training goes on from w_t itself."""
  write_reversal_corpus(tmp_path, sizes=(("train", 200), ("val", 10)))
  decay, steps, folder = 0.7, 4, str(tmp_path / "model")
  run = build_trainer(tmp_path, tmp_path / "model", f"--train_steps={steps}", "--save_every=1",
                      f"--keep_checkpoints={steps}", "--dev_prefix=", f"--ema_decay={decay}")
  run.train()

  def weights(checkpoint):
    model, _, step = checkpoints.load_for_inference(folder, "src", "tgt", checkpoint)
    return step, [v.numpy().astype(np.float64) for v in model.trainable_variables]

  trained = [weights(f"{folder}/ckpt-{step}")[1] for step in range(1, steps + 1)]
  expected = trained[0]
  for current in trained[1:]:
    expected = [decay * e + (1 - decay) * w for e, w in zip(expected, current)]
  step, average = weights("ema")
  assert step == steps
  for want, got in zip(expected, average):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert max(np.abs(e - w).max() for e, w in zip(average, trained[-1])) > 1e-4
  # the model trains on from its own weights, not from the average it saved
  for got, want in zip(run.model.trainable_variables, trained[-1]):
    np.testing.assert_array_equal(got.numpy(), want.astype(np.float32))


def test_moving_average_cannot_be_switched_on_a_resumed_run(tmp_path):
  """Keras numbers the optimizer's variables, so a checkpoint with a moving average would be
  read into the wrong Adam moments by a run without one (and the reverse)."""
  import pytest

  from tf_transformer.model_dir import ModelDirError

  write_reversal_corpus(tmp_path, sizes=(("train", 200), ("val", 10)))
  build_trainer(tmp_path, tmp_path / "model", "--train_steps=1", "--dev_prefix=",
                "--ema_decay=0.9").train()
  with pytest.raises(ModelDirError, match=r"optimizer.json: .*moving_average=True.*"
                     r"moving_average=False"):
    build_trainer(tmp_path, tmp_path / "model", "--train_steps=2", "--eval_every=100")


class _ScriptedEvaluator:
  """An Evaluator whose dev BLEU depends only on the weights in the model (constant ones, from
  final_weights_test.constant_checkpoints), recording what the end of a run asks of it."""

  def __init__(self, model, bleu_by_weight: dict):
    import types

    from tests.tf_transformer.training.final_weights_test import weight_value
    self.weight = lambda: weight_value(model)
    self.bleu_by_weight = bleu_by_weight
    self.best_bleu = tf.Variable(10.0)
    self.writer = tf.summary.create_noop_writer()
    self.data = types.SimpleNamespace(dev_pairs=lambda count: {"tgt": [("aa bb", "bb aa")] * 3})
    self.scored, self.tested = [], []

  def dev_bleu(self):
    self.scored.append(self.weight())
    return self.bleu_by_weight[self.scored[-1]]

  def test(self, output_dir, step, restore_best=True):
    self.tested.append((output_dir, step, restore_best, self.weight()))
    return {"test_bleu": 1.0}


def test_only_the_chief_chooses_the_final_weights(tiny_model_dir, tmp_path):
  """At the end of a multi-worker run the chief scores the candidates on dev, keeps the
  winner's weights for its test score and writes final.json; another worker scores none,
  writes nothing into the model directory, and its test score restores the best checkpoint."""
  import json
  import types

  from tests.tf_transformer.training.final_weights_test import constant_checkpoints, weight_value
  from tf_transformer import model_dir as model_dir_lib
  from tf_transformer.config import TrainConfig
  from tf_transformer.model import build_model

  model_config = model_dir_lib.read_config(str(tiny_model_dir))
  model_dir = tmp_path / "model"
  model_dir_lib.check_config(str(model_dir), model_config)
  # training checkpoints of weights 3 and 5 (their average: 4), the best checkpoint step 2's
  constant_checkpoints(model_dir, model_config, {("", 1): 3.0, ("", 2): 5.0, ("best", 2): 5.0})
  results = {}
  for is_chief in (False, True):
    model = build_model(model_config)
    evaluator = _ScriptedEvaluator(model, {5.0: 10.0, 4.0: 30.0})
    write_dir = str(model_dir) if is_chief else str(tmp_path / "worker_1")
    tf.io.gfile.makedirs(write_dir)
    run = trainer.Trainer(
        model, types.SimpleNamespace(iterations=tf.Variable(2, dtype=tf.int64)),
        train_step=None, iterator=None,
        manager=types.SimpleNamespace(latest_checkpoint=f"{write_dir}/ckpt-2"),
        evaluator=evaluator, writer=None,
        config=TrainConfig(model_dir=str(model_dir), train_steps=2, average_last=2),
        write_dir=write_dir, clock=trainer.TrainingClock(tf.distribute.get_strategy(), 1),
        is_chief=is_chief)
    trained = weight_value(model)
    results[is_chief] = run.train()
    if not is_chief:  # the model as trained went to the test, which restores the best itself
      assert evaluator.scored == [] and evaluator.tested == [(write_dir, 2, True, trained)]
      assert not (model_dir / "final.json").exists() and not (model_dir / "average").exists()
      assert not (model_dir / "results.json").exists()
      assert not (tmp_path / "worker_1").exists()  # its temporary folder is removed
  assert results[False] == {"step": 2, "best_dev_bleu": 10.0, "test_bleu": 1.0}
  # the chief: best (weights 5) scores 10, the average of the two checkpoints (4) 30
  assert evaluator.scored == [5.0, 4.0] and evaluator.tested == [(str(model_dir), 2, False, 4.0)]
  assert results[True] == {"step": 2, "best_dev_bleu": 10.0, "final_weights": "average",
                           "dev_bleu_best": 10.0, "dev_bleu_average": 30.0, "test_bleu": 1.0}
  final = json.loads((model_dir / "final.json").read_text())
  assert (final["choice"], final["checkpoint"]) == ("average", "average/ckpt-2")
  assert json.loads((model_dir / "results.json").read_text()) == results[True]
