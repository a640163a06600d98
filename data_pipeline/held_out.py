"""A deterministic dev/test split of a parallel corpus that has none.

Which pairs are held out depends only on the seed and the source sentences, not on the order
of the lines or on the machine: each distinct source sentence gets the key
sha256("<seed>\\t<source>"), the keys are sorted, and whole groups of pairs with the same
source go to dev, then to test, until each has its size; the rest is training data. A
sentence repeated in the corpus therefore never stands on both sides of the split.
"""

import contextlib
import dataclasses
import hashlib
import os

from common import files
from data_pipeline import corpora

SPLITS = ("train", "dev", "test")


@dataclasses.dataclass(frozen=True)
class SplitCounts:
  """Pairs written per split; of train, those from the extra corpora, and the extra pairs
  left out because their source sentence is held out."""
  train: int
  dev: int
  test: int
  extra_train: int
  extra_held_out: int


def _key(seed: int, source: str) -> bytes:
  return hashlib.sha256(f"{seed}\t{source}".encode("utf-8")).digest()


def held_out_keys(pairs, dev_size: int, test_size: int, seed: int) -> tuple[set, set]:
  """The source keys of the dev and the test pairs.

  Args:
    pairs: iterable of (source, target) strings, the corpus to split.
    dev_size, test_size: pairs wanted in each (a group of pairs with one source is never cut,
      so a split can exceed its size by the group's size - 1).

  Raises:
    corpora.CorpusError: the corpus has fewer distinct sources than dev_size + test_size
      needs, with one left for training.
  """
  counts = {}
  for source, _ in pairs:
    key = _key(seed, source)
    counts[key] = counts.get(key, 0) + 1
  dev, test, sizes = set(), set(), [0, 0]
  for key in sorted(counts):
    index = 0 if sizes[0] < dev_size else 1 if sizes[1] < test_size else None
    if index is None:
      return dev, test
    (dev, test)[index].add(key)
    sizes[index] += counts[key]
  raise corpora.CorpusError(f"{len(counts)} distinct source sentences cannot give "
                            "{dev_size} and {test_size} pairs and leave any for training",
                            dev_size=dev_size, test_size=test_size)


def write_split(source_path: str, target_path: str, out_dir: str, src_lang: str,
                tgt_lang: str, dev_size: int, test_size: int, seed: int,
                extra_train=(), on_bad_line: str = "error",
                extra_prefix: str = "train") -> SplitCounts:
  """Writes `out_dir`/{train,dev,test}.{src_lang,tgt_lang}, UTF-8, one pair a line.

  Args:
    source_path, target_path: the corpus to split (plain or .gz, line-aligned), validated
      first (line counts, UTF-8 per `on_bad_line`); empty pairs are left out.
    extra_train: (source path, target path) pairs of corpora for training, but for the pairs
      whose source sentence is held out: appended to train, or, with another
      `extra_prefix`, written to `out_dir`/{extra_prefix}.{src_lang,tgt_lang} (a corpus of
      its own, to weigh against train: train_prefix="train,{extra_prefix}").

  Returns:
    The pairs written to each split.
  """
  if extra_prefix in SPLITS[1:] or not extra_prefix:
    raise corpora.CorpusError(f"the extra corpora cannot be written as {extra_prefix!r}: "
                              "it names a held-out split")
  corpora_to_read = [(source_path, target_path), *extra_train]
  skipped = {paths: corpora.scan_parallel(*paths, on_bad_line=on_bad_line).bad_lines
             for paths in corpora_to_read}

  def pairs(paths):
    return corpora.iterate_parallel(*paths, skip_lines=skipped[paths])

  dev, test = held_out_keys(pairs(corpora_to_read[0]), dev_size, test_size, seed)
  os.makedirs(out_dir, exist_ok=True)
  counts = dict.fromkeys(SPLITS, 0)
  extra = dropped = 0
  names = SPLITS + ((extra_prefix,) if extra_train and extra_prefix not in SPLITS else ())
  with contextlib.ExitStack() as stack:  # every file complete before any is renamed
    outputs = {(split, lang): stack.enter_context(
                   files.atomic_file(os.path.join(out_dir, f"{split}.{lang}")))
               for split in names for lang in (src_lang, tgt_lang)}

    def write(split, source, target):
      outputs[split, src_lang].write(source + "\n")
      outputs[split, tgt_lang].write(target + "\n")
      counts[split] = counts.get(split, 0) + 1

    for source, target in pairs(corpora_to_read[0]):
      key = _key(seed, source)
      write("dev" if key in dev else "test" if key in test else "train", source, target)
    for paths in extra_train:
      for source, target in pairs(paths):
        key = _key(seed, source)
        if key in dev or key in test:
          dropped += 1  # a held-out sentence must not be trained on
          continue
        write(extra_prefix, source, target)
        extra += 1
  # train: the pairs of every training file (train, and extra_prefix's)
  return SplitCounts(sum(counts[name] for name in names if name not in SPLITS[1:]),
                     counts["dev"], counts["test"], extra, dropped)
