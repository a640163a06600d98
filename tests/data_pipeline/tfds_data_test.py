"""TFDS datasets: built offline from local files, trained from, sharded per worker; clear errors."""

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from data_pipeline import tfds_data
from data_pipeline.corpora import CorpusError
from tests import testutil
from tf_transformer.config import DataConfig


def write_split(folder, name, lines, offset=0):
  numbers = range(offset, offset + lines)
  return testutil.write_corpus(folder, name, [f"w{i % 11} w{i % 7} s{i}" for i in numbers],
                               [f"s{i} w{i % 7} w{i % 11}" for i in numbers])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  folder = tmp_path_factory.mktemp("corpus")
  splits = {"train": write_split(folder, "train", 300), "validation":
            write_split(folder, "val", 20, 1000), "test": write_split(folder, "test", 10, 2000),
            "extra": write_split(folder, "extra", 60, 5000)}
  out = folder / "tfds"
  tfds_data.build_dataset(splits, "toy_corpus", str(out), "src", "tgt")
  return folder, out


def config(out, **kwargs):
  return DataConfig(dataset="tfds:toy_corpus", tfds_data_dir=str(out), src_lang="src",
                    tgt_lang="tgt", vocab_size=40, max_length=16, batch_tokens=128,
                    shuffle_buffer=100, **kwargs)


def test_built_dataset_has_every_pair_of_each_split(built):
  folder, out = built
  builder = tfds.builder("toy_corpus", data_dir=str(out))
  assert {name: split.num_examples for name, split in builder.info.splits.items()} == {
      "train": 300, "validation": 20, "test": 10, "extra": 60}
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
  assert len(data.dev_pairs()["tgt"]) == 20 and len(data.dev_pairs(limit=5)["tgt"]) == 5
  assert len(data.test_pairs()["tgt"]) == 10


def test_training_splits_are_drawn_from_by_weight(built, tmp_path):
  """--train_prefix=train,extra --train_weights=1,1: half the rows from the 60 pairs of
  "extra" (a chi-square bound at 1 - 1e-4), against a fifth by the splits' sizes; the subword
  model knows both splits' words."""
  _, out = built
  for weights, share in (((1.0, 1.0), 0.5), ((), 60 / 360)):
    data = tfds_data.TfdsData(config(out, train_prefix="train,extra", train_weights=weights),
                              str(tmp_path / str(share)))
    extra = total = 0
    for source, _, _ in data.train_batches(seed=2).take(200).as_numpy_iterator():
      for text in data.vocabulary.source.detokenize(source).numpy():
        extra += int(text.decode().split()[-1][1:]) >= 5000
        total += 1
    assert total > 2000
    expected = total * share
    chi_square = (extra - expected) ** 2 / expected + (extra - expected) ** 2 / (total - expected)
    assert chi_square < 15.14, (extra, total, share)
  with pytest.raises(CorpusError,
                     match="tfds:toy_corpus: no .nope. split .*check train_prefix=train,nope"):
    tfds_data.TfdsData(config(out, train_prefix="train,nope"), str(tmp_path / "nope"))


def test_wrong_language_is_a_corpus_error(built, tmp_path):
  _, out = built
  with pytest.raises(CorpusError, match=r"tfds:toy_corpus: no language de \(it has src, tgt\)"):
    tfds_data.TfdsData(DataConfig(dataset="tfds:toy_corpus", tfds_data_dir=str(out),
                                  src_lang="src", tgt_lang="de"), str(tmp_path))


def test_same_languages_are_refused(tmp_path):
  splits = {"train": write_split(tmp_path, "train", 5)}
  with pytest.raises(CorpusError, match="src_lang and tgt_lang must differ, both are 'src'"):
    tfds_data.build_dataset(splits, "same", str(tmp_path / "out"), "src", "src")


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
      f"tfds:ted_hrlr_translate/pt_to_en: not prepared in tfds_data_dir={tmp_path} and cannot "
      "be downloaded and prepared here (Failed to establish a new connection: Name or service "
      "not known); prepare it on a machine with internet access and copy the folder, or pass "
      "tfds_data_dir")
  assert error.value.as_flags().endswith("copy the folder, or pass --tfds_data_dir")


def test_unknown_dataset_is_a_corpus_error(tmp_path):
  with pytest.raises(CorpusError, match=r"^tfds:no_such_corpus: no such TFDS dataset"):
    tfds_data.TfdsData(DataConfig(dataset="tfds:no_such_corpus", tfds_data_dir=str(tmp_path)),
                       str(tmp_path / "model"))
