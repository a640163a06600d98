"""tf_transformer/serving/warmup.py: the replay of an export's warm-up requests and its guard on
the memory mappings of XLA's compiled programs."""

import logging

import pytest
import tensorflow as tf

from tf_transformer.model_dir import ModelDirError
from tf_transformer.serving import warmup


def test_warmups_are_refused_before_their_compiled_programs_pass_the_memory_mapping_limit():
  problem = warmup._memory_mapping_problem
  assert problem(60_000, None, [500], 500) is None  # the system sets no limit
  # before the first request: room for a base-size program, or not
  assert problem(1_000, 65_530, [], 200) is None
  assert "than the 530 that vm.max_map_count=65,530 leaves" in problem(65_000, 65_530, [], 200)
  # 250 a request for 100 more: 25,000 needed, 55,530 left
  assert problem(10_000, 65_530, [500, 0], 100, per_request=250) is None
  # 250 more requests need 62,500: more than a quarter over the 45,530 left
  assert problem(20_000, 65_530, [500, 0], 250, per_request=250) == (
      "need about 62,500 more memory mappings, and vm.max_map_count=65,530 leaves 45,530")
  # no estimate before the requests of a whole batch size have run: the first requests
  # compile the programs that later ones share
  assert problem(20_000, 65_530, [500, 0], 250) is None
  # whatever the estimate, no request runs with less room than twice the largest growth
  assert problem(64_700, 65_530, [0, 0, 500], 1) == (
      "need about 1,000 more memory mappings, and vm.max_map_count=65,530 leaves 830")
  assert problem(64_400, 65_530, [0, 0, 500], 1) is None


def test_the_replay_estimates_the_larger_batch_sizes_from_the_signatures_warmed_at_each(
    tmp_path, monkeypatch, caplog):
  """An export with --batching warms two signatures at every batch size (each request compiles
  a program) and the others once, at the smallest (reusing those programs): the estimate of
  the larger sizes counts the recurring signatures' growth alone, so the replay refuses as
  soon as the smallest size has run, not requests later, and logs the estimate."""
  once = ["translate_nbest", "translate_prefix", "score", "align", "translate_constrained",
          "sample_prefix"]
  plan = [(name, size, text) for size in (1, 2, 4, 8) for name in ("serving_default", "sample")
          for text in ("a", "b c d")] + [(name, 1, "Hello.") for name in once]
  folder = tmp_path / "assets.extra"
  folder.mkdir()
  with tf.io.TFRecordWriter(str(folder / "tf_serving_warmup_requests")) as writer:
    for name, size, text in plan:
      writer.write(warmup._warmup_log(name, [text] * size).SerializeToString())
  mappings, ran = [10_000], []

  def signature(name):
    def run(**inputs):
      ran.append((name, int(next(iter(inputs.values())).shape[0])))
      mappings[0] += 500 if name in ("serving_default", "sample") else 0
    return run

  loaded = type("Loaded", (), {"signatures": {name: signature(name) for name, *_ in plan}})
  monkeypatch.setattr(warmup, "memory_mappings", lambda: mappings[0])
  # 10 requests of one row add 2,000; the 12 larger ones will add 6,000, over 1.25 x the room
  monkeypatch.setattr(warmup, "memory_mapping_limit", lambda: 10_000 + 2_000 + 4_500)
  with caplog.at_level(logging.INFO, logger="absl"), pytest.raises(
      ModelDirError, match=r"its 22 warm-up requests compile XLA programs that need about "
      r"6,000 more memory mappings, and vm.max_map_count=16,500 leaves 4,500: raise it"):
    warmup.replay_warmup_requests(str(tmp_path), loaded())
  assert ("the warm-up requests of 1 row(s) added 2,000 memory mappings; the 12 larger ones "
          "are expected to add about 6,000 (vm.max_map_count=16,500 leaves 4,500)") in caplog.text
  assert sorted(ran) == sorted((name, 1) for name, size, _ in plan if size == 1)


def test_an_export_of_some_signatures_warms_each_search_at_every_batch_size():
  """With --batching, each search's signature of COMPILING runs its warm-ups at every allowed
  batch size; an export without it has the first of its own that runs that search do so
  (translate_nbest for the beam search, sample_prefix for sampling), the others one row."""
  from tf_transformer.config import BatchingConfig
  from tf_transformer.serving import signatures

  assert signatures.compiling(signatures.NAMES) == signatures.COMPILING
  names = ("translate_nbest", "translate_prefix", "sample_prefix", "score", "align")
  assert signatures.compiling(names) == ("translate_nbest", "sample_prefix")
  batching = BatchingConfig(max_batch_size=4)
  requests = warmup._warmup_batches(names, batching, {"Hello.": 16, "x " * 20: 32})
  sizes = {}
  for name, texts in requests:
    sizes.setdefault(name, []).append(len(texts))
  assert sizes == {"translate_nbest": [1, 1, 2, 2, 4, 4], "sample_prefix": [1, 1, 2, 2, 4, 4],
                   "translate_prefix": [1], "score": [1], "align": [1, 8]}
  with pytest.raises(ValueError, match=r"no signature translate \(the signatures: "
                     r"serving_default, translate_nbest, "):
    signatures.chosen(("serving_default", "translate"))
  assert signatures.chosen(("score", "serving_default")) == ("serving_default", "score")
  assert signatures.chosen(()) == signatures.NAMES
