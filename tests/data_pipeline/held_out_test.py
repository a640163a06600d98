"""The held-out split: deterministic, independent of line order, whole groups, no leak."""

import random

import pytest

from data_pipeline import corpora, held_out
from tests import testutil


def make_pairs(count, seed=0):
  rng = random.Random(seed)
  return [(f"source {i} {rng.random():.6f}", f"target {i}") for i in range(count)]


def split(tmp_path, pairs, name, dev_size=20, test_size=30, seed=7, extra=()):
  folder = tmp_path / name
  folder.mkdir()
  paths = testutil.write_pairs(folder, "corpus", pairs)
  extra_paths = [testutil.write_pairs(folder, f"extra{i}", e) for i, e in enumerate(extra)]
  counts = held_out.write_split(*paths, str(folder / "out"), "en", "de", dev_size, test_size,
                                seed, extra_paths)
  written = {s: list(zip(*(open(folder / "out" / f"{s}.{lang}", encoding="utf-8").read()
                           .splitlines() for lang in ("en", "de"))))
             for s in held_out.SPLITS}
  return counts, written


def test_split_depends_on_the_sentences_not_their_order(tmp_path):
  pairs = make_pairs(200)
  counts, first = split(tmp_path, pairs, "a")
  shuffled = pairs[:]
  random.Random(1).shuffle(shuffled)
  _, second = split(tmp_path, shuffled, "b")
  assert (counts.train, counts.dev, counts.test) == (150, 20, 30)
  for name in held_out.SPLITS:
    assert sorted(first[name]) == sorted(second[name])
  assert sorted(first["train"] + first["dev"] + first["test"]) == sorted(pairs)
  # each split keeps the corpus's order
  assert first["dev"] == [p for p in pairs if p in set(first["dev"])]
  _, other_seed = split(tmp_path, pairs, "c", seed=8)
  assert sorted(other_seed["dev"]) != sorted(first["dev"])


def test_a_repeated_source_stays_on_one_side(tmp_path):
  pairs = make_pairs(100)
  repeated = [(source, f"another translation {i}") for i, (source, _) in enumerate(pairs[:40])]
  _, written = split(tmp_path, pairs + repeated, "a", dev_size=10, test_size=10)
  sides = {name: {source for source, _ in written[name]} for name in held_out.SPLITS}
  assert not sides["train"] & sides["dev"] and not sides["train"] & sides["test"]
  assert not sides["dev"] & sides["test"]
  assert sum(len(v) for v in written.values()) == 140


def test_extra_corpora_train_but_never_on_a_held_out_source(tmp_path):
  pairs = make_pairs(100)
  extra = [("extra one", "eins"), ("extra two", "zwei")] + pairs[:100]
  counts, written = split(tmp_path, pairs, "a", dev_size=10, test_size=10, extra=[extra])
  held = {source for name in ("dev", "test") for source, _ in written[name]}
  assert counts.extra_held_out == 20 and counts.extra_train == 82
  assert written["train"][-82:] == [p for p in extra if p[0] not in held]
  assert ("extra one", "eins") in written["train"]


def test_too_small_a_corpus_is_one_line_error(tmp_path):
  with pytest.raises(corpora.CorpusError, match="10 distinct source sentences cannot give "
                     "dev_size=5 and test_size=5 pairs and leave any for training"):
    split(tmp_path, make_pairs(10), "a", dev_size=5, test_size=5)
  assert not (tmp_path / "a" / "out").exists() or not list((tmp_path / "a" / "out").iterdir())
