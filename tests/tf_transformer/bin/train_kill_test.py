"""A training run killed (SIGKILL) at five moments in turn, each rerun resuming from the newest
complete checkpoint the kills before it left, ends with the weights of a run never killed, its
two training corpora drawn from by weight, its source pieces and activations dropped (the
mixture's and both dropouts' draws resume where they were too)."""

import concurrent.futures

import numpy as np
import pytest

from tests import testutil
from tests.tf_transformer.bin.train_test import final_weights, write_corpus

STEPS, EVERY = 8, 4  # saves and dev evaluations at steps 4 and 8

# runs the train CLI with a hook that SIGKILLs the process at one moment
_KILLED_RUN = """
import os, signal, sys
import tensorflow as tf
from absl import app
from tf_transformer.training import evaluator, run, trainer
from tf_transformer.bin import train

moment = sys.argv.pop(1)
die = lambda: os.kill(os.getpid(), signal.SIGKILL)


def half_written(directory, number):
  # what a save killed while writing leaves: its temporary folder and a partial index
  prefix = os.path.join(directory, f"ckpt-{number}")
  os.makedirs(prefix + "_temp", exist_ok=True)
  with open(os.path.join(prefix + "_temp", "part-00000-of-00001.data-00000-of-00001"), "wb") as f:
    f.write(b"partial")
  with open(prefix + ".index", "wb") as f:
    f.write(b"partial")
  die()


if moment == "startup":  # the trainer is built, no step has run
  create = run.create_trainer
  run.create_trainer = lambda *args: (create(*args), die())
elif moment == "mid_step":  # step 6 was applied in memory, nothing of it saved
  note, calls = trainer.Trainer._note_shapes, []
  def noting(self, shapes):
    calls.append(1)
    if len(calls) == 6:
      die()
    note(self, shapes)
  trainer.Trainer._note_shapes = noting
else:
  save = tf.train.CheckpointManager.save
  def saving(self, checkpoint_number=None, **kwargs):
    # the first best checkpoint is saved at step 4 (any BLEU beats none); the 2nd save at 8
    if os.path.basename(self.directory) == "best":
      if moment == "best_save" and checkpoint_number == 4:
        half_written(self.directory, checkpoint_number)
    elif moment == "checkpoint_write" and checkpoint_number == 8:
      half_written(self.directory, checkpoint_number)
    return save(self, checkpoint_number, **kwargs)
  tf.train.CheckpointManager.save = saving
  if moment == "evaluation":  # the dev translations of step 8 (the run resumed at step 4)
    evaluator.Evaluator.translate = lambda *args, **kwargs: die()

sys.argv = ["train", *sys.argv[1:]]
app.run(train.main)
"""


def _args(data_dir, model_dir):
  return ["--flagfile=flags/tiny.cfg", f"--data_dir={data_dir}", f"--model_dir={model_dir}",
          "--src_lang=src", "--tgt_lang=tgt", "--train_prefix=train,extra",
          "--train_weights=1,2", "--source_token_dropout=0.2", "--dropout_rate=0.1",
          "--dev_prefix=train", "--eval_sentences=8",
          f"--train_steps={STEPS}", f"--save_every={EVERY}", f"--eval_every={EVERY}",
          "--deterministic"]


def _final_weights(model_dir):
  return final_weights(model_dir / f"ckpt-{STEPS}")


# where the process is killed, in the order of the chain -> the step its rerun resumes from:
# none for a kill before the first complete checkpoint
MOMENTS = {"startup": None, "best_save": None, "mid_step": 4, "checkpoint_write": 4,
           "evaluation": 4}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The final weights of a run never killed; {moment: (the run killed at it, the run after
  it)}: in one model folder, one run killed at each moment in turn and a last run to the end;
  and that folder. The run never killed goes beside the chain."""
  corpus = tmp_path_factory.mktemp("corpus")
  write_corpus(corpus)
  extra = [[f"w{(i * 5 + j) % 13}" for j in range(1 + i % 3)] for i in range(60)]
  testutil.write_corpus(corpus, "extra", [" ".join(w) for w in extra],
                        [" ".join(reversed(w)) for w in extra])
  model = tmp_path_factory.mktemp("killed") / "model"

  def chain():
    killed = [testutil.run_python(_KILLED_RUN, moment, *_args(corpus, model))
              for moment in MOMENTS]
    return killed + [testutil.run_cli("tf_transformer.train", *_args(corpus, model))]

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    reference = pool.submit(testutil.run_cli, "tf_transformer.train",
                            *_args(corpus, corpus / "reference"))
    processes = pool.submit(chain).result()
    assert reference.result().returncode == 0, reference.result().stderr
  return (_final_weights(corpus / "reference"),
          dict(zip(MOMENTS, zip(processes, processes[1:]))), model)


@pytest.mark.parametrize("moment", MOMENTS)
def test_killed_run_resumes_from_the_last_complete_checkpoint(runs, moment):
  _, outcomes, model = runs
  killed, rerun = outcomes[moment]
  assert killed.returncode == -9, killed.stderr[-3000:]
  resumed_step = MOMENTS[moment]
  if resumed_step is None:
    assert "resumed from" not in rerun.stderr
  else:
    assert f"resumed from {model}/ckpt-{resumed_step} at step {resumed_step}" in rerun.stderr


def test_the_last_run_ends_with_the_weights_of_a_run_never_killed(runs):
  reference, outcomes, model = runs
  last = outcomes["evaluation"][1]
  assert last.returncode == 0, last.stderr[-3000:]
  assert not list(model.glob("**/*_temp")) and not list(model.glob("**/*.tmp-*"))
  for name, value in _final_weights(model).items():
    np.testing.assert_array_equal(value, reference[name], err_msg=name)
  assert (model / "results.json").exists()
