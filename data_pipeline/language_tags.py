"""The target-language token of a multilingual model (Johnson et al. 2017).

A model trained with several target languages (tgt_lang="de,fr,cs") reads "<2fr> " before a
source sentence as "translate into French". The tokens are symbols of the model's one
SentencePiece model, so a tagged sentence goes through the subword model like any other text,
in training, in translation and in an exported SavedModel alike.
"""

import tensorflow as tf

from common.errors import UserError


# the subword pieces of "<2xx> " before a sentence: the word boundary "▁" and the token
TAG_PIECES = 2


class LanguageError(UserError, ValueError):
  """A target language the model cannot translate into, or none chosen where one must be."""


def tag(lang: str) -> str:
  """The source-side token that asks for `lang`, e.g. "<2fr>"."""
  return f"<2{lang}>"


def tagged(texts: list[str], lang: str) -> list[str]:
  """`texts` with `lang`'s token before each one."""
  return [f"{tag(lang)} {text}" for text in texts]


def tag_sources(pairs: tf.data.Dataset, lang: str) -> tf.data.Dataset:
  """(source, target) string pairs with `lang`'s token before each source, a block of pairs a
  call (a call per pair would cost more than the work)."""
  prefix = tf.constant(tag(lang) + " ")

  def add(source, target):
    return prefix + source, target

  return pairs.batch(1024).map(add, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def choose(target_language: str | None, languages: tuple[str, ...], what: str) -> str | None:
  """The language to tag the sources of a model trained into `languages` with: None for a
  model of one language (which needs no token), else `target_language`, checked.

  Args:
    what: the model, for the message.

  Raises:
    LanguageError: no target language for a multilingual model, or one it was not trained on.
  """
  if target_language is not None and target_language not in languages:
    raise LanguageError(f"{what} translates into {', '.join(languages)}, not "
                        f"{target_language!r}")
  if len(languages) == 1:
    return None
  if target_language is None:
    raise LanguageError(f"{what} translates into {', '.join(languages)}: choose one "
                        "({tgt_lang:name} or target_language)", tgt_lang=None)
  return target_language
