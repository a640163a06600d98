"""Sentence lists through the inference functions: token-based batches, hard alignments, and
the Python API (the README's example, run as written)."""

import ast
import pathlib
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline.token_ids import EOS_ID, PAD_ID
from export import saved_model
from tests import testutil
from tf_transformer import decoding, inference
from tf_transformer import length_batching
from tf_transformer import checkpoints
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import ConfigError, DecodeConfig
from tf_transformer import loading
from tf_transformer.length_batching import hard_alignment, make_batches, translate_texts
from tf_transformer.model import build_model
from tf_transformer.model_dir import ModelDirError

TEXTS = ["aa", "bb cc dd", "ee ff gg hh ii", "", "jj kk ll mm nn oo pp qq", "aa bb",
         "cc dd ee ff gg hh ii jj kk ll mm nn", " ", "oo pp qq rr", "ss"]


def test_batches_keep_within_rows_and_tokens():
  lengths = [3, 9, 1, 4, 4, 12, 2, 7, 30, 5]
  for batch_size, batch_tokens in [(3, None), (None, 16), (2, 16), (None, 1)]:
    batches = make_batches(lengths, batch_size, batch_tokens)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
      assert batch_size is None or len(batch) <= batch_size
      # a row longer than the limit (30 > 16) goes alone
      assert batch_tokens is None or len(batch) == 1 or \
          len(batch) * max(lengths[i] for i in batch) <= batch_tokens
  # shortest first, each batch filled as far as the limit allows
  assert make_batches(lengths, None, 16) == [[2, 6, 0, 3], [4, 9], [7], [1], [5], [8]]


def test_token_batches_translate_like_sentence_batches(tiny_model_dir):
  functions = loading.load_model_dir(str(tiny_model_dir), "en", "de",
                                     DecodeConfig(beam_size=2, nbest=2, max_source_length=8,
                                                  extra_decode_length=4)).functions()
  texts = TEXTS
  counts = functions.count_tokens(texts, "source")
  vocabulary = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")[1]
  pieces = vocabulary.source.tokenize(tf.constant(texts)).row_lengths().numpy()
  assert counts == [min(int(n), 8) + 1 for n in pieces]  # + </s>, truncated at max_length
  batches = []

  def recording(batch):
    batches.append([text.decode() for text in batch.numpy()])
    return functions.translate_nbest(batch)

  by_tokens = translate_texts(recording, texts, batch_size=None, batch_tokens=12,
                              count_tokens=functions.count_tokens)
  by_sentences = translate_texts(functions.translate_nbest, texts, batch_size=3)
  assert len(batches) > 1 and max(len(batch) for batch in batches) > 1
  for batch in batches:
    longest = max(functions.count_tokens(batch, "source"))
    assert len(batch) == 1 or len(batch) * longest <= 12, batch
  assert by_tokens[0] == by_sentences[0]
  for got, expected in zip(by_tokens[1], by_sentences[1]):
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_hard_alignment_takes_each_target_pieces_most_attended_source_piece():
  source = ["\u2581a", "\u2581b", "c", "</s>", ""]
  target = ["\u2581x", "y", "\u2581z", "</s>", ""]
  attention = np.array([[0.1, 0.6, 0.1, 0.2, 0.0],
                        [0.1, 0.1, 0.2, 0.6, 0.0],   # </s> is left out: c (2) wins
                        [0.5, 0.2, 0.2, 0.1, 0.0],
                        [0.0, 0.0, 0.1, 0.9, 0.0],   # the target </s>: no pair
                        [0.0, 0.0, 0.0, 0.0, 0.0]])  # padding
  assert hard_alignment(attention, source, target) == [(1, 0), (2, 1), (0, 2)]
  assert hard_alignment(attention[:, 3:], ["</s>", ""], target) == []  # a blank source


def _readme_python_block() -> str:
  readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
  return re.search(r"\*\*From Python\*\*.*?```python\n(.*?)```", readme, re.S).group(1)


def _run_statements(code: str) -> tuple[dict, list]:
  """Runs `code` statement by statement: (its namespace, the value of each expression)."""
  namespace, values = {}, []
  for node in ast.parse(code).body:
    if isinstance(node, ast.Expr):
      values.append(eval(compile(ast.Expression(node.value), "README.md", "eval"), namespace))
    else:
      exec(compile(ast.Module([node], []), "README.md", "exec"), namespace)
  return namespace, values


@pytest.mark.parametrize("kind", ["model_dir", "saved_model"])
def test_the_readme_python_example_runs_as_written(tiny_model_dir, tmp_path, kind):
  path = str(tiny_model_dir)
  if kind == "saved_model":
    path = saved_model.export(path, str(tmp_path / "export"), saved_model.Options(
        "en", "de", DecodeConfig(beam_size=4, extra_decode_length=8)))
  code = _readme_python_block()
  assert '"models/multi30k_en_de"' in code
  namespace, values = _run_statements(code.replace("models/multi30k_en_de", path))
  model, sources, nbest = namespace["model"], namespace["sources"], namespace["nbest"]
  assert model.is_saved_model == (kind == "saved_model")
  first, scores, prefixed, constrained = values
  assert isinstance(first, list) and len(first) == 1 and isinstance(first[0], str)
  assert [len(hypotheses) for hypotheses in nbest] == [4, 4]
  for hypotheses in nbest:
    assert all(isinstance(h, inference.Hypothesis) for h in hypotheses)
    assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
  assert nbest[0][0].text == first[0]
  # the log-probability of each target over the length penalty, from the ids in float32
  weights, vocabulary, _ = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")
  targets = ["Ein Hund rennt am Strand.", "Zwei Männer reden."]
  for source, target_text, score in zip(sources, targets, scores):
    source_ids, target_ids = (
        tf.concat([side.tokenize(tf.constant([text])), [[EOS_ID]]], axis=1).to_tensor()
        for side, text in ((vocabulary.source, source), (vocabulary.target, target_text)))
    want = decoding.score(weights, source_ids, target_ids, alpha=0.6)[0]
    assert score == pytest.approx(float(want), abs=1e-4)
  # the prefix's pieces (the tiny vocabulary spells "Ein Hund" with unknown pieces) come first
  target = vocabulary.target
  prefix_text = target.detokenize(target.tokenize(tf.constant(["Ein Hund"])))[0].numpy().decode()
  assert prefixed[0].startswith(prefix_text) and prefixed[0] != first[0]
  assert prefixed[1] == nbest[1][0].text  # an empty prefix forces nothing
  # terminology: even a random model's outputs hold the term, and not the banned word
  words = [re.findall(r"\w+", output) for output in constrained]
  assert "rennt" in words[0] and "reden" not in words[1], constrained


def test_a_saved_models_weights_and_search_are_refused_as_fixed_at_export(tmp_path):
  """load() refuses a checkpoint or search settings for a SavedModel (before reading it), and
  a SavedModel exported with beam 2 and alpha 0.6 refuses a larger beam, another alpha, an
  nbest over its beam and a prefix count unlike the sources', before any search runs."""
  (tmp_path / "saved_model.pb").write_bytes(b"")
  for settings in ({"checkpoint": "latest"}, {"beam_size": 2}):
    with pytest.raises(ModelDirError) as error:
      loading.load(str(tmp_path), **settings)
    assert str(error.value) == (f"{tmp_path}: a SavedModel holds its own weights and search "
                                "(fixed at export); give no checkpoint or search settings")

  def searched(*args):
    pytest.fail("a search ran")

  # what load() makes of such a SavedModel, its signatures never to be called
  model = inference.TranslationModel(
      "export/2", True, DecodeConfig(beam_size=2, alpha=0.6),
      lambda config: inference.InferenceFunctions(*[searched] * 8, length_batching.count_words))
  for search, fixed in (({"beam_size": 3}, "beam_size=2 is"), ({"alpha": 1.0}, "alpha=0.6 is"),
                        ({"beam_size": 3, "sampling_topk": 5},
                         "beam_size=2 and sampling_topk=0 are")):
    with pytest.raises(ModelDirError) as error:
      model.translate(["w1 w2"], **search)
    assert str(error.value) == (f"export/2: {fixed} fixed in this SavedModel at export; "
                                f"export again to change {'it' if ' is' in fixed else 'them'}")
  with pytest.raises(ConfigError) as error:
    model.translate(["w1 w2"], nbest=3)
  assert str(error.value) == "DecodeConfig: nbest=3 must be at most beam_size=2"
  with pytest.raises(ModelDirError) as error:
    model.translate(["w1 w2", "w3"], target_prefix=["w2"])
  assert str(error.value) == ('2 sources but 1 target prefixes: give one prefix per source '
                              '("" for none)')


def test_translate_and_score_refuse_an_nbest_outside_the_beam_and_unaligned_lists(
    tiny_model_dir):
  """A model directory's translate takes an nbest from 1 to the call's beam, one prefix per
  source, and score one target per source; each other request is refused in one line."""
  model = loading.load(str(tiny_model_dir), beam_size=2, extra_decode_length=4)
  for nbest, beam, message in ((3, None, "nbest=3 must be at most beam_size=2"),
                               (4, 3, "nbest=4 must be at most beam_size=3"),
                               (0, None, "nbest=0 must be an integer >= 1")):
    with pytest.raises(ConfigError) as error:
      model.translate(["aa bb"], nbest=nbest, beam_size=beam)
    assert str(error.value) == f"DecodeConfig: {message}"
  with pytest.raises(ModelDirError) as error:
    model.translate(["aa", "bb", "cc"], target_prefix=["dd", "ee"])
  assert str(error.value) == ('3 sources but 2 target prefixes: give one prefix per source '
                              '("" for none)')
  with pytest.raises(ModelDirError) as error:
    model.score(["aa", "bb"], ["cc"])
  assert str(error.value) == "2 sources but 1 targets: score takes line-aligned pairs"


def _ids(side, texts):
  """texts' subword ids + </s>, PAD_ID-padded, as the translator reads them."""
  return tf.concat([side.tokenize(tf.constant(texts)),
                    tf.RaggedTensor.from_tensor(tf.fill([len(texts), 1], EOS_ID))],
                   axis=1).to_tensor(default_value=PAD_ID)


def test_load_checkpoint_loads_that_checkpoints_weights(tiny_model_dir, tmp_path):
  """load(checkpoint=...) scores with the weights of the checkpoint it names: best/ckpt-1
  holds the fixture's weights, the latest checkpoint (ckpt-2) others."""
  folder = tmp_path / "model"
  shutil.copytree(tiny_model_dir, folder)
  config = model_dir_lib.read_config(str(folder))
  first = build_model(config)
  tf.train.Checkpoint(model=first).restore(str(folder / "ckpt-1")).expect_partial()
  second = build_model(config)
  rng = np.random.default_rng(0)
  for weight, original in zip(second.weights, first.weights):
    weight.assign(original.numpy() + rng.normal(0, 0.5, original.shape).astype(np.float32))
  tf.train.CheckpointManager(tf.train.Checkpoint(model=second), str(folder), 5,
                             checkpoint_name="ckpt").save(checkpoint_number=2)
  tf.train.CheckpointManager(tf.train.Checkpoint(model=first), str(folder / "best"), 1,
                             checkpoint_name="ckpt").save(checkpoint_number=1)
  sources, targets = ["aa bb cc", "dd ee"], ["ff gg", "hh ii jj"]
  vocabulary = checkpoints.load_for_inference(str(folder), "en", "de")[1]
  source_ids, target_ids = _ids(vocabulary.source, sources), _ids(vocabulary.target, targets)
  expected = {name: decoding.score(weights, source_ids, target_ids, alpha=0.6).numpy()
              for name, weights in (("first", first), ("second", second))}
  assert np.abs(expected["first"] - expected["second"]).max() > 0.1
  for checkpoint, weights in (("best", "first"), ("latest", "second")):
    model = loading.load(str(folder), checkpoint=checkpoint, beam_size=2,
                           extra_decode_length=4)
    np.testing.assert_allclose(model.score(sources, targets), expected[weights], atol=1e-4)


def test_a_target_prefix_is_cut_at_max_source_length_pieces(tiny_model_dir):
  """With max_source_length=3, a prefix of five pieces (one a word here) forces its first
  three: the translations and scores are those of the three-piece prefix."""
  model = loading.load(str(tiny_model_dir), beam_size=2, max_source_length=3,
                         extra_decode_length=6)
  target = checkpoints.load_for_inference(str(tiny_model_dir), "en", "de")[1].target
  assert target.tokenize(tf.constant(["ss tt uu vv ww"])).row_lengths().numpy().tolist() == [5]
  long, cut = model.translate(["aa bb", "aa bb"], target_prefix=["ss tt uu vv ww", "ss tt uu"],
                              nbest=2)
  assert [h.text for h in long] == [h.text for h in cut]
  np.testing.assert_allclose([h.score for h in long], [h.score for h in cut], rtol=1e-5)
  assert all(h.text.startswith("ss tt uu") for h in cut)
  # the whole prefix, forced, would have given other translations
  assert not any(h.text.startswith("ss tt uu vv ww") for h in cut)


def test_sampled_translations_repeat_for_a_seed_in_any_batch(tiny_model_dir):
  """load().translate samples: nbest draws a source, the same for the same seed whatever the
  batches, the first of them the one draw of nbest 1; another seed draws others; a sentence's
  draws are those of its number (first_index)."""
  model = loading.load(str(tiny_model_dir), extra_decode_length=4)
  texts = ["aa bb", "cc dd ee", "", "ff gg hh ii", "jj"]
  search = dict(strategy="sample", sampling_temperature=1.5, seed=5)
  three = model.translate(texts, nbest=3, batch_size=2, **search)
  batched = model.translate(texts, nbest=3, batch_size=64, **search)
  assert [[h.text for h in hs] for hs in three] == [[h.text for h in hs] for hs in batched]
  np.testing.assert_allclose([[h.score for h in hs] for hs in three],
                             [[h.score for h in hs] for hs in batched], rtol=1e-5)
  assert three[2] == [inference.Hypothesis("", 0.0)] * 3
  one = model.translate(texts, **search)
  assert one == [hypotheses[0].text for hypotheses in three]
  assert model.translate(texts[3:4], first_index=3, **search) == one[3:4]
  others = model.translate(texts, nbest=3, **dict(search, seed=6))
  assert [[h.text for h in hs] for hs in others] != [[h.text for h in hs] for hs in three]
  assert len({h.text for hypotheses in three for h in hypotheses}) > 5  # not one output each


def test_a_loaded_model_translates_after_the_program_seeds_tensorflow(tiny_model_dir):
  """A user's tf.random.set_seed after load() (it clears TensorFlow's kernel cache) leaves the
  model's subword models working."""
  model = loading.load(str(tiny_model_dir), extra_decode_length=4)
  before = model.translate(TEXTS)
  tf.random.set_seed(1)
  assert model.translate(TEXTS) == before


def test_an_ensemble_of_a_model_with_itself_translates_as_the_model(tiny_model_dir, tmp_path):
  """load([dir, dir]) (any weights) translates, samples, scores and aligns as load(dir); a
  SavedModel among the members and members of different vocabularies are refused in one line."""
  texts = ["aa bb", "cc dd ee", "", "ff gg hh ii"]
  single = loading.load(str(tiny_model_dir), beam_size=2, extra_decode_length=4)
  for weights in ((), (1, 3)):
    doubled = loading.load([str(tiny_model_dir)] * 2, weights=weights, beam_size=2,
                             extra_decode_length=4)
    assert doubled.path == f"{tiny_model_dir},{tiny_model_dir}"
    testutil.assert_translate_alike(doubled, single, texts, nbest=2)
    sampled = dict(strategy="sample", seed=3, sampling_temperature=1.5)
    assert doubled.translate(texts, **sampled) == single.translate(texts, **sampled)
    np.testing.assert_allclose(doubled.score(texts, ["vv", "ww xx", "", "yy"]),
                               single.score(texts, ["vv", "ww xx", "", "yy"]), rtol=1e-5)
    assert doubled.align(texts)[1] == single.align(texts)[1]
  (tmp_path / "saved_model.pb").write_bytes(b"")
  with pytest.raises(ModelDirError) as error:
    loading.load([str(tiny_model_dir), str(tmp_path)])
  assert str(error.value) == (f"{tmp_path}: a SavedModel; an ensemble is of model directories "
                              "(export one with export.saved_model.export of several directories)")


def test_an_ensemble_of_two_directories_scores_the_weighted_mean_in_their_order(
    tiny_model_dir, other_tiny_model_dir):
  """load([A, B], weights=(1, 3)): each score is 0.25 A's + 0.75 B's (the mean of the members'
  log-probabilities is linear in them), so members taken in another order fail; the weights
  change the translations."""
  texts, targets = ["aa bb", "cc dd ee", "ff gg hh ii"], ["vv", "ww xx", "yy zz aa"]
  members = [str(tiny_model_dir), str(other_tiny_model_dir)]
  alone = [loading.load(member, extra_decode_length=4) for member in members]
  scores = [np.array(model.score(texts, targets)) for model in alone]
  assert np.abs(scores[0] - scores[1]).min() > 0.05  # the members differ
  ensemble = loading.load(members, weights=(1, 3), extra_decode_length=4)
  np.testing.assert_allclose(ensemble.score(texts, targets), 0.25 * scores[0] + 0.75 * scores[1],
                             rtol=1e-5)
  other_way = loading.load(members, weights=(3, 1), extra_decode_length=4)
  np.testing.assert_allclose(other_way.score(texts, targets),
                             0.75 * scores[0] + 0.25 * scores[1], rtol=1e-5)


def test_ensemble_members_must_share_their_vocabulary(tiny_model_dir, reversal_model):
  with pytest.raises(ModelDirError) as error:
    loading.load([str(tiny_model_dir), str(reversal_model[0])], src_lang="en", tgt_lang="de")
  assert str(error.value) == (
      f"{tiny_model_dir} and {reversal_model[0]} have different vocabularies (their subword "
      "models differ): an ensemble's members must share one")
