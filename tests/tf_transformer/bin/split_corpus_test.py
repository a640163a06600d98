"""The split_corpus CLI: files written, one-line errors, and the documented Ja-Vi ALT split."""

import hashlib

import pytest

from data_pipeline import corpora
from tests import testutil
from tf_transformer.bin import shared_flags


def test_writes_train_dev_test_and_says_how_to_train(tmp_path):
  pairs = [(f"s{i}", f"t{i}") for i in range(50)]
  src, tgt = testutil.write_pairs(tmp_path, "corpus", pairs)
  result = testutil.run_cli("tf_transformer.bin.split_corpus", f"--src={src}", f"--tgt={tgt}",
                            "--src_lang=en", "--tgt_lang=de", "--dev_size=5", "--test_size=7",
                            f"--out={tmp_path / 'out'}")
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == (f"train with --data_dir={tmp_path / 'out'} --train_prefix="
                                   "train --dev_prefix=dev --test_prefix=test")
  lines = {name: (tmp_path / "out" / name).read_text().splitlines()
           for name in ("train.en", "dev.en", "test.en", "train.de")}
  assert [len(lines[n]) for n in ("train.en", "dev.en", "test.en")] == [38, 5, 7]
  assert lines["train.de"] == [t for s, t in pairs if s in set(lines["train.en"])]


def test_extra_corpora_go_to_a_corpus_of_their_own_with_extra_prefix(tmp_path):
  """--extra_prefix=more: the extra pairs, but for those whose source is held out, in
  more.{en,de}, and train holds the main corpus's pairs only."""
  pairs = [(f"s{i}", f"t{i}") for i in range(50)]
  src, tgt = testutil.write_pairs(tmp_path, "corpus", pairs)
  extra = [(f"s{i}", f"x{i}") for i in range(40, 60)]  # s40-s49 also in the main corpus
  extra_src, extra_tgt = testutil.write_pairs(tmp_path, "extra", extra)
  out = tmp_path / "out"
  result = testutil.run_cli("tf_transformer.bin.split_corpus", f"--src={src}", f"--tgt={tgt}",
                            f"--extra_src={extra_src}", f"--extra_tgt={extra_tgt}",
                            "--extra_prefix=more", "--src_lang=en", "--tgt_lang=de",
                            "--dev_size=5", "--test_size=7", f"--out={out}")
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == (f"train with --data_dir={out} --train_prefix=train,more "
                                   "--dev_prefix=dev --test_prefix=test")
  held = set((out / "dev.en").read_text().split()) | set((out / "test.en").read_text().split())
  assert (out / "train.en").read_text().split() == [s for s, _ in pairs if s not in held]
  assert (out / "more.en").read_text().split() == [s for s, _ in extra if s not in held]
  assert (out / "more.de").read_text().split() == [t for s, t in extra if s not in held]
  testutil.assert_one_line_error(
      testutil.run_cli("tf_transformer.bin.split_corpus", f"--src={src}", f"--tgt={tgt}",
                       f"--extra_src={extra_src}", f"--extra_tgt={extra_tgt}",
                       "--extra_prefix=dev", "--dev_size=5", "--test_size=7", f"--out={out}"),
      "error: --extra_prefix='dev' must name a training corpus, not a held-out split")


@pytest.mark.parametrize("left_out, extra, message", [
    ("--src", (), "error: --src is required (see --helpfull)"),
    ("--dev_size", (), "error: --dev_size is required (see --helpfull)"),
    (None, ("--extra_src=a,b", "--extra_tgt=c"),
     "error: --extra_src names 2 file(s) but --extra_tgt 1; they pair up in order"),
])
def test_flag_errors_are_one_line(tmp_path, left_out, extra, message):
  src, tgt = testutil.write_pairs(tmp_path, "corpus", [("a", "b")])
  given = {"--src": src, "--tgt": tgt, "--out": f"{tmp_path}/o", "--dev_size": 1,
           "--test_size": 1}
  args = [f"{name}={value}" for name, value in given.items() if name != left_out]
  testutil.assert_one_line_error(
      testutil.run_cli("tf_transformer.bin.split_corpus", *args, *extra), message)


def test_the_ja_vi_alt_split_is_the_documented_one(tmp_path):
  """docs/data.md's Ja->Vi split: ALT minus 1,000 dev and 1,000 test pairs, plus Tatoeba."""
  ja_vi = testutil.shared_data("ja_vi")
  result = testutil.run_cli(
      "tf_transformer.bin.split_corpus", f"--src={ja_vi}/alt_wiki_20k/train.ja.gz",
      f"--tgt={ja_vi}/alt_wiki_20k/train.vi.gz", f"--extra_src={ja_vi}/tatoeba_2k/data.ja.gz",
      f"--extra_tgt={ja_vi}/tatoeba_2k/data.vi.gz", "--src_lang=ja", "--tgt_lang=vi",
      "--dev_size=1000", "--test_size=1000", "--seed=1234", f"--out={tmp_path}")
  assert result.returncode == 0, result.stderr
  assert "train 20227 pairs (2126 from --extra_src, 0 extra pairs left out" in result.stderr
  digests = {name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()[:16]
             for name in ("dev.ja", "test.ja")}
  assert digests == {"dev.ja": "411641e8cb786137", "test.ja": "18d445fce46702ba"}
  # the Ja->Vi preset reads the split
  testutil.parse_flags("ja_vi", f"--data_dir={tmp_path}")
  c = shared_flags.data_config_from_flags()
  for prefix in (c.train_prefix, c.dev_prefix, c.test_prefix):
    corpora.scan_parallel(*(corpora.find_corpus_file(tmp_path, prefix, lang)
                            for lang in (c.src_lang, c.tgt_lang)))
