"""Several training corpora (--train_prefix=a,b --train_weights=...): each drawn from in
proportion to its weight, the subword model trained on all of them, one corpus exactly today's
pipeline, and a bad weight refused in one line."""

import numpy as np
import pytest

from data_pipeline.parallel_data import ParallelData
from tf_transformer.config import ConfigError, DataConfig
from tests import testutil

# each corpus its own letters, so that a batch row tells which corpus it came from
LETTERS = {"train": "abcdefgh", "extra": "nopqrstu", "third": "vwxyz"}


def _write(folder, prefix, lines, seed):
  rng = np.random.default_rng(seed)
  words = [letter * 2 for letter in LETTERS[prefix]]
  sources = [" ".join(rng.choice(words, size=int(rng.integers(1, 6)))) for _ in range(lines)]
  testutil.write_corpus(folder, prefix, sources, [" ".join(s.split()[::-1]) for s in sources])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("corpora")
  for seed, (prefix, lines) in enumerate((("train", 150), ("extra", 50), ("third", 40))):
    _write(folder, prefix, lines, seed)
  return folder


def _config(data_dir, **kwargs):
  return DataConfig(**{**dict(data_dir=str(data_dir), src_lang="src", tgt_lang="tgt",
                              vocab_size=60, max_length=30, batch_tokens=256,
                              shuffle_buffer=100, dev_prefix=None), **kwargs})


def _corpus_counts(data, batches: int, seed: int = 5) -> dict[str, int]:
  """{prefix: rows} over the first `batches` training batches, each row's corpus told by the
  first letter of its source text."""
  counts = dict.fromkeys(LETTERS, 0)
  for source, _, _ in data.train_batches(seed=seed).take(batches).as_numpy_iterator():
    for text in data.vocabulary.source.detokenize(source).numpy():
      letter = text.decode().strip()[0]
      counts[next(prefix for prefix, letters in LETTERS.items() if letter in letters)] += 1
  return counts


@pytest.mark.parametrize("weights", [(1.0, 3.0, 0.0), (2.0, 1.0, 1.0)])
def test_each_corpus_is_drawn_by_its_weight(data_dir, tmp_path, weights):
  """Over about 4,000 rows the shares pass a chi-square test at the 1 - 1e-4 level (the
  draws are independent, each corpus's share a binomial one); a weight of 0 is never drawn,
  however small the other corpora (they repeat on their own)."""
  data = ParallelData(_config(data_dir, train_prefix="train,extra,third",
                              train_weights=weights), str(tmp_path / "model"))
  counts = _corpus_counts(data, batches=150)
  total = sum(counts.values())
  assert total > 3000
  shares = np.array(weights) / sum(weights)
  observed = np.array([counts[prefix] for prefix in ("train", "extra", "third")])
  drawn = shares > 0
  expected = total * shares[drawn]
  chi_square = float(((observed[drawn] - expected) ** 2 / expected).sum())
  # the 1 - 1e-4 quantiles of chi-square with 1 and 2 degrees of freedom
  assert chi_square < {2: 15.14, 3: 18.42}[int(drawn.sum())], (counts, shares)
  assert (observed[~drawn] == 0).all(), counts


def test_without_weights_the_corpora_are_drawn_as_if_concatenated(data_dir, tmp_path):
  data = ParallelData(_config(data_dir, train_prefix="train,extra"), str(tmp_path / "model"))
  assert data.train_weights == pytest.approx((150 / 200, 50 / 200))
  # every corpus's pairs, once each and in order, train the subword model and the lexicon
  pairs = list(data.train_pairs().as_numpy_iterator())
  assert len(pairs) == 200
  assert pairs[0][0].decode()[0] in LETTERS["train"]
  assert pairs[-1][0].decode()[0] in LETTERS["extra"]
  pieces = {data.vocabulary.source.id_to_string(i).numpy().decode()
            for i in range(data.vocabulary.source_size)}
  assert any("n" in piece for piece in pieces) and any("a" in piece for piece in pieces)


def test_one_corpus_gives_the_batches_of_one_corpus_whatever_the_others_weigh_nothing(
    data_dir, tmp_path):
  """--train_prefix=train alone, with weight 1, and beside corpora of weight 0 (the same
  subword model): the same batches, batch for batch."""
  model_dir = str(tmp_path / "model")
  mixed = ParallelData(_config(data_dir, train_prefix="train,extra,third",
                               train_weights=(1.0, 0.0, 0.0)), model_dir)
  runs = [mixed, ParallelData(_config(data_dir), model_dir),
          ParallelData(_config(data_dir, train_weights=(1.0,)), model_dir)]
  batches = [list(data.train_batches(seed=3).take(30).as_numpy_iterator()) for data in runs]
  for other in batches[1:]:
    for got, want in zip(other, batches[0]):
      for got_part, want_part in zip(got, want):
        np.testing.assert_array_equal(got_part, want_part)


@pytest.mark.parametrize("prefix, weights, problem", [
    ("train,extra", (1.0,), "count"), ("train,extra", (1.0, -1.0), "negative"),
    ("train,extra", (0.0, 0.0), "all 0"), ("train,extra", (1.0, float("nan")), "nan"),
    ("train,,extra", (), "an empty name")])
def test_bad_weights_are_one_config_error(prefix, weights, problem):
  with pytest.raises(ConfigError, match="^DataConfig: train_") as error:
    DataConfig(data_dir="data", train_prefix=prefix, train_weights=weights)
  assert "\n" not in str(error.value), problem
