"""TFDS datasets: built offline from local files, trained from, sharded per worker; clear errors."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from data_pipeline import build, tfds_data
from data_pipeline.corpora import CorpusError
from tf_transformer.config import DataConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_split(folder, name, lines, offset=0):
  src, tgt = folder / f"{name}.src", folder / f"{name}.tgt"
  src.write_text("".join(f"w{(i + offset) % 11} w{(i + offset) % 7} s{i + offset}\n"
                         for i in range(lines)))
  tgt.write_text("".join(f"s{i + offset} w{(i + offset) % 7} w{(i + offset) % 11}\n"
                         for i in range(lines)))
  return str(src), str(tgt)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  folder = tmp_path_factory.mktemp("corpus")
  splits = {"train": write_split(folder, "train", 300), "validation":
            write_split(folder, "val", 20, 1000), "test": write_split(folder, "test", 10, 2000)}
  out = folder / "tfds"
  build.build(splits, "toy_corpus", str(out), "src", "tgt")
  return folder, out


def config(out, **kwargs):
  return DataConfig(dataset="tfds:toy_corpus", tfds_data_dir=str(out), src_lang="src",
                    tgt_lang="tgt", vocab_size=40, max_length=16, batch_tokens=128,
                    shuffle_buffer=100, **kwargs)


def test_built_dataset_has_every_pair_of_each_split(built):
  folder, out = built
  builder = tfds.builder("toy_corpus", data_dir=str(out))
  assert {name: split.num_examples for name, split in builder.info.splits.items()} == {
      "train": 300, "validation": 20, "test": 10}
  pairs = {(ex["src"].decode(), ex["tgt"].decode())
           for ex in tfds.as_numpy(builder.as_dataset(split="train"))}
  with open(folder / "train.src") as src, open(folder / "train.tgt") as tgt:
    assert pairs == {(s.strip(), t.strip()) for s, t in zip(src, tgt)}


def test_workers_read_disjoint_shares_covering_the_train_split(built, tmp_path):
  _, out = built
  data = tfds_data.TfdsData(config(out), str(tmp_path))
  shares = []
  for shard in range(2):
    split = tfds.even_splits("train", n=2)[shard]
    shares.append({s.decode() for s, _ in tfds.as_numpy(data._pairs(split))})
  assert not shares[0] & shares[1]
  assert len(shares[0] | shares[1]) == 300
  batch = next(iter(data.train_batches(seed=1, num_shards=2, shard=1)))
  assert len(batch) == 3 and batch[0].dtype == tf.int32
  assert len(data.dev_pairs()) == 20 and len(data.dev_pairs(limit=5)) == 5
  assert len(data.test_pairs()) == 10


def test_wrong_language_is_a_corpus_error(built, tmp_path):
  _, out = built
  with pytest.raises(CorpusError, match=r"tfds:toy_corpus: no language de \(it has src, tgt\)"):
    tfds_data.TfdsData(DataConfig(dataset="tfds:toy_corpus", tfds_data_dir=str(out),
                                  src_lang="src", tgt_lang="de"), str(tmp_path))


def run(*args):
  return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=400)


def test_build_cli_then_training_from_the_tfds_dataset(tmp_path):
  src, tgt = write_split(tmp_path, "train", 200)
  dev_src, dev_tgt = write_split(tmp_path, "val", 10, 500)
  out = tmp_path / "tfds"
  result = run("data_pipeline.build", f"--src={src}", f"--tgt={tgt}", f"--dev_src={dev_src}",
               f"--dev_tgt={dev_tgt}", "--src_lang=src", "--tgt_lang=tgt", "--name=cli_corpus",
               f"--out={out}")
  assert result.returncode == 0, result.stderr
  assert f"--dataset=tfds:cli_corpus --tfds_data_dir={out}" in result.stdout
  result = run("tf_transformer.train", "--flagfile=flags/tiny.cfg", "--dataset=tfds:cli_corpus",
               f"--tfds_data_dir={out}", "--src_lang=src", "--tgt_lang=tgt",
               f"--model_dir={tmp_path / 'model'}", "--train_steps=20", "--eval_every=20")
  assert result.returncode == 0, result.stderr
  results = json.loads((tmp_path / "model" / "results.json").read_text())
  assert results["step"] == 20 and results["best_dev_bleu"] >= 0.0


def test_build_cli_refuses_mismatched_files(tmp_path):
  src, _ = write_split(tmp_path, "train", 5)
  (tmp_path / "short.tgt").write_text("a\nb\n")
  result = run("data_pipeline.build", f"--src={src}", f"--tgt={tmp_path / 'short.tgt'}",
               "--src_lang=src", "--tgt_lang=tgt", "--name=bad", f"--out={tmp_path / 'out'}")
  assert result.returncode == 1
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: {src} has 5 lines but {tmp_path / 'short.tgt'} has 2; parallel files must be "
      "line-aligned")


def test_unprepared_public_dataset_offline_is_a_corpus_error(tmp_path, monkeypatch):
  """Offline, TFDS's download fails (after minutes of retries, so simulated here)."""
  def offline(*args, **kwargs):
    raise ConnectionError("Failed to establish a new connection: Name or service not known")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
  with pytest.raises(CorpusError) as error:
    tfds_data.TfdsData(DataConfig(dataset="tfds:ted_hrlr_translate/pt_to_en",
                                  tfds_data_dir=str(tmp_path), src_lang="pt", tgt_lang="en"),
                       str(tmp_path / "model"))
  assert str(error.value) == (
      f"tfds:ted_hrlr_translate/pt_to_en: not prepared in --tfds_data_dir={tmp_path} and cannot "
      "be downloaded and prepared here (Failed to establish a new connection: Name or service "
      "not known); prepare it on a machine with internet access and copy the folder, or pass "
      "--tfds_data_dir")


def test_unknown_dataset_is_a_corpus_error(tmp_path):
  with pytest.raises(CorpusError, match=r"^tfds:no_such_corpus: no such TFDS dataset"):
    tfds_data.TfdsData(DataConfig(dataset="tfds:no_such_corpus", tfds_data_dir=str(tmp_path)),
                       str(tmp_path / "model"))
