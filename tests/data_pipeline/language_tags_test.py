"""Target-language tokens: how the subword model segments them, how a multilingual task's
corpora, dev and test sets carry them, and the one-line refusals."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline import language_tags, tokenizer
from data_pipeline.parallel_data import ParallelData
from tests import testutil
from tf_transformer.config import ConfigError, DataConfig

LANGS = ("de", "fr", "cs")


def write_multilingual(folder, sizes=(("train", 60), ("val", 8), ("test", 5))):
  """{split}.en and {split}.{de,fr,cs}: each language's targets say which language they are
  in, so a pair's language shows in its target."""
  for split, count in sizes:
    sources = [f"a cat number {i} sits" for i in range(count)]
    for lang in LANGS:
      targets = [f"{lang} {i} {lang}" for i in range(count)]
      testutil.write_corpus(folder, split, sources, targets, langs=("en", lang))


def multilingual_data(folder, **changes):
  write_multilingual(folder)
  config = DataConfig(data_dir=str(folder), src_lang="en", tgt_lang=",".join(LANGS),
                      test_prefix="test", vocab_size=60, max_length=40, batch_tokens=400,
                      **changes)
  return ParallelData(config, str(folder / "model"))


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_a_tag_is_two_pieces_before_the_pieces_of_the_sentence_alone(tmp_path, model_type):
  sentences = [f"a cat number {i} sits on the mat" for i in range(200)]
  path = str(tmp_path / "spm.model")
  tokenizer.train_sentencepiece(sentences, path, 40, model_type=model_type,
                                symbols=("<2de>", "<2fr>"))
  vocabulary = tokenizer.load_vocabulary(path, path)
  tagged = vocabulary.source.tokenize(language_tags.tagged(["a cat sits", "the mat"], "fr"))
  alone = vocabulary.source.tokenize(["a cat sits", "the mat"])
  tag_id = int(vocabulary.source.string_to_id("<2fr>"))
  assert tag_id not in (1, int(vocabulary.source.string_to_id("<2de>")))  # not <unk>
  for with_tag, without in zip(tagged.to_list(), alone.to_list()):
    assert with_tag[language_tags.TAG_PIECES - 1] == tag_id
    assert with_tag[language_tags.TAG_PIECES:] == without


def test_choose_checks_the_language_against_the_models():
  assert language_tags.choose(None, ("de",), "m") is None  # one language: no token
  assert language_tags.choose("de", ("de",), "m") is None
  assert language_tags.choose("fr", LANGS, "m") == "fr"
  with pytest.raises(language_tags.LanguageError, match=r"^m translates into de, fr, cs: "
                     r"choose one \(tgt_lang or target_language\)$"):
    language_tags.choose(None, LANGS, "m")
  with pytest.raises(language_tags.LanguageError, match=r"^m translates into de, fr, cs, not "
                     "'it'$"):
    language_tags.choose("it", LANGS, "m")
  with pytest.raises(language_tags.LanguageError, match="translates into de, not 'fr'"):
    language_tags.choose("fr", ("de",), "m")


def test_a_multilingual_task_tags_each_source_with_its_pairs_target_language(tmp_path):
  data = multilingual_data(tmp_path)
  assert data.multilingual and [corpus.lang for corpus in data.train_corpora] == list(LANGS)
  # the subword model holds each language's token as one piece
  source = data.vocabulary.source
  tag_ids = {lang: int(source.string_to_id(language_tags.tag(lang))) for lang in LANGS}
  assert len(set(tag_ids.values())) == 3 and 1 not in tag_ids.values()
  # every pair drawn for training: the token of the language its target is in
  batches = data.train_batches(seed=1).take(20)
  seen = collections.Counter()
  for source_ids, _, target_ids in batches:
    targets = data.vocabulary.target.detokenize(
        tf.ragged.boolean_mask(target_ids, target_ids > 3)).numpy()
    for ids, target in zip(source_ids.numpy(), targets):
      lang = target.decode().split()[0]
      assert ids[language_tags.TAG_PIECES - 1] == tag_ids[lang], (ids, target)
      seen[lang] += 1
  assert set(seen) == set(LANGS)
  # dev and test: a set per language, sources tagged as text
  for sets, count in ((data.dev_pairs(), 8), (data.test_pairs(), 5)):
    assert list(sets) == list(LANGS)
    for lang, pairs in sets.items():
      assert pairs[:2] == [(f"<2{lang}> a cat number {i} sits", f"{lang} {i} {lang}")
                           for i in range(2)]
      assert len(pairs) == count
  assert {lang: len(pairs) for lang, pairs in data.dev_pairs(limit=3).items()} == dict.fromkeys(
      LANGS, 3)
  # the dev loss reads every language's dev pairs
  rows = sum(int(batch[0].shape[0]) for batch in data.dev_batches())
  assert rows == 3 * 8


def test_one_target_language_reads_as_before(tmp_path):
  """Bilingual: no tokens in the subword model or in the sources; dev and test are one set
  keyed by the language."""
  write_multilingual(tmp_path)
  config = DataConfig(data_dir=str(tmp_path), src_lang="en", tgt_lang="fr",
                      test_prefix="test", vocab_size=60, max_length=40, batch_tokens=400)
  data = ParallelData(config, str(tmp_path / "model"))
  assert not data.multilingual
  assert int(data.vocabulary.source.string_to_id("<2fr>")) == 1  # <unk>: no such piece
  assert data.dev_pairs()["fr"][0] == ("a cat number 0 sits", "fr 0 fr")
  assert list(data.test_pairs()) == ["fr"]


def test_weights_count_one_per_language_and_corpus(tmp_path):
  data = multilingual_data(tmp_path, train_weights=(1.0, 0.0, 3.0))
  assert np.allclose(data.train_weights, (0.25, 0.0, 0.75))
  with pytest.raises(ConfigError, match=r"train_weights=\[1.0, 1.0\] must be a finite number "
                     r">= 0 for each of the 3 train_prefix corpora, not all 0 \(train.de, "
                     r"train.fr, train.cs\)"):
    DataConfig(data_dir=".", tgt_lang="de,fr,cs", train_weights=(1.0, 1.0))


@pytest.mark.parametrize("changes, problem", [
    (dict(tgt_lang="de,de"), "distinct, non-empty, comma-separated languages"),
    (dict(tgt_lang="de,,fr"), "distinct, non-empty, comma-separated languages"),
    (dict(tgt_lang="en,de"), "languages other than the source's (en)"),
    (dict(tgt_lang="de,fr", shared_vocab=False),
     "trained with shared_vocab (one subword model over every language)"),
    (dict(tgt_lang="de,fr", dataset="tfds:x"),
     "read from text files (data_dir), not a TFDS dataset"),
])
def test_several_target_languages_refuse_what_cannot_hold(changes, problem):
  with pytest.raises(ConfigError) as error:
    DataConfig(data_dir=".", src_lang="en", **changes)
  assert str(error.value) == (f"DataConfig: tgt_lang={changes['tgt_lang']!r}: several target "
                              f"languages must be {problem}")
