"""import_marian: a Marian model in the Hugging Face format (tests/fixtures/marian/tiny, made
and trained with transformers by tests/fixtures/marian/make_fixture.py) reads and translates as
transformers reads and translates it, from the model directory, the Python API and a SavedModel.

The fixture holds transformers' own outputs (expected.json): its tokenizer's ids, teacher-forced
log-probabilities and greedy and beam outputs; this suite needs neither torch nor
transformers.
"""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline.token_ids import BOS_ID, EOS_ID
from tests import testutil

FIXTURE = testutil.ROOT / "tests" / "fixtures" / "marian" / "tiny"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
# the texts MarianTokenizer reads otherwise, by design: it takes a special token's spelling
# ("</s>", "<unk>", "<pad>") in a text for that token (a literal "</s>" would end the source);
# we read every text as its characters
SPECIAL_SPELLINGS = ("</s>", "<unk>", "<pad>")
# of the fixture's 202 target ids a sentence's search writes a quarter, fewer than its source
# pieces' 20 lexicon candidates each: each piece keeps its best ones (by frequency alone, the
# capitalised first words, rarer, were left out of 57 of the 100 outputs)
_SHORTLIST_SIZE = 48


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  """(model directory, {Marian id: our id})."""
  model_dir = tmp_path_factory.mktemp("imported") / "model"
  result = testutil.run_cli("tf_transformer.bin.import_marian", f"--from={FIXTURE}",
                            f"--model_dir={model_dir}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == str(model_dir)
  table = json.loads((model_dir / "vocab.pieces.json").read_text())
  vocab = json.loads((FIXTURE / "vocab.json").read_text())
  ours = {marian_id: table.index(piece) for piece, marian_id in vocab.items()}
  return model_dir, ours


@pytest.fixture(scope="module")
def loaded(imported):
  from tf_transformer.checkpoints import load_for_inference

  model, vocabulary, _ = load_for_inference(str(imported[0]), "src", "tgt")
  return model, vocabulary


def test_tokenization_gives_marian_tokenizers_ids(imported, loaded):
  _, ours = imported
  _, vocabulary = loaded
  for side, key, tokenizer in (("tokenizer", "input_ids", vocabulary.source),
                               ("targets", "labels", vocabulary.target)):
    texts = EXPECTED[side]["texts"]
    got = tokenizer.tokenize(tf.constant(texts)).to_list()
    want = [[ours[i] for i in row] for row in EXPECTED[side][key]]
    differ = [text for text, g, w in zip(texts, got, want) if g + [EOS_ID] != w]
    assert all(any(s in text for s in SPECIAL_SPELLINGS) for text in differ), differ
    assert len(texts) - len(differ) >= (250 if side == "tokenizer" else 40)
  # unknown characters among them: MarianTokenizer's <unk> is ours
  assert any(ours[1] in row and ours[1] == 1 for row in
             [[ours[i] for i in ids] for ids in EXPECTED["tokenizer"]["input_ids"]])


def _log_probs(model, source, labels):
  """Our teacher-forced log-probability of each of `labels` (our ids, EOS last) after
  `source` (our ids, EOS last): float64 [len(labels)]."""
  logits = model((tf.constant([source]), tf.constant([[BOS_ID] + labels[:-1]])),
                 training=False).numpy()[0].astype(np.float64)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  return np.array([log_probs[i, label] for i, label in enumerate(labels)])


def test_teacher_forced_log_probabilities_are_transformers(imported, loaded):
  _, ours = imported
  model, _ = loaded
  forced = EXPECTED["teacher_forced"]
  worst = 0.0
  for source, labels, theirs in zip(forced["input_ids"], forced["labels"], forced["log_probs"]):
    got = _log_probs(model, [ours[i] for i in source], [ours[i] for i in labels])
    worst = max(worst, float(np.abs(got - np.array(theirs)).max()))
  print(f"largest log-probability difference {worst:.2e} over {len(forced['labels'])} pairs")
  assert worst < 1e-4


def _search(model, vocabulary, sources, beam_size):
  """Our best output ids (with EOS) of each source, one sentence at a time as transformers
  ran them, at most 40 tokens."""
  from tf_transformer import decoding
  from tf_transformer.config import DecodeConfig

  config = DecodeConfig(beam_size=beam_size, max_decode_length=40)
  search = tf.function(lambda ids: decoding.decode(model, ids, config)[0][0, 0],
                       input_signature=[tf.TensorSpec([1, None], tf.int32)])
  outputs = []
  for row in vocabulary.source.tokenize(tf.constant(sources)).to_list():
    ids = search(tf.constant([row + [EOS_ID]])).numpy().tolist()
    outputs.append(ids[:ids.index(EOS_ID) + 1] if EOS_ID in ids else ids)
  return outputs


@pytest.mark.parametrize("kind, beam_size", [("greedy", 1), ("beam", 4)])
def test_greedy_and_beam_outputs_are_transformers(imported, loaded, kind, beam_size):
  """Greedy: the argmax path, as generate(num_beams=1). Beam 4: transformers' finishing rule
  (length_penalty 1.0: the sum of log-probabilities over the length, early_stopping off) and
  ours (GNMT's ((5 + length) / 6)^0.6) may prefer different finished hypotheses; on this
  model they agree on every sentence."""
  _, ours = imported
  model, vocabulary = loaded
  expected = EXPECTED[kind]
  got = _search(model, vocabulary, expected["sources"], beam_size)
  # transformers' outputs start with the decoder start token
  want = [[ours[i] for i in ids[1:]] for ids in expected["output_ids"]]
  assert sum(len(ids) > 2 for ids in want) > len(want) // 2  # real outputs, not just EOS
  differ = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
  assert not differ, differ[:3]


def test_the_python_api_and_the_cli_translate_strings_as_transformers_decodes(imported,
                                                                             tmp_path):
  """String in, string out: tokenization, search and detokenization against transformers'
  batch_decode(skip_special_tokens=True) of its greedy outputs; evaluate scores them."""
  import sacrebleu

  import tf_transformer

  model_dir, _ = imported
  expected = EXPECTED["greedy"]
  model = tf_transformer.load(str(model_dir), beam_size=1, max_decode_length=40)
  assert model.translate(expected["sources"]) == expected["outputs"]
  result = testutil.run_cli("tf_transformer.bin.translate", f"--model_dir={model_dir}",
                            "--beam_size=1", "--max_decode_length=40",
                            stdin="".join(line + "\n" for line in expected["sources"][:5]))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines() == expected["outputs"][:5]
  # evaluate: references transformers' outputs for 20 sentences, 10 others' for the last 10
  src, ref = testutil.write_corpus(tmp_path, "dev", expected["sources"][:30],
                                   expected["outputs"][:20] + expected["references"][20:30][::-1])
  result = testutil.run_cli("tf_transformer.bin.evaluate", f"--model_dir={model_dir}",
                            f"--src={src}", f"--ref={ref}", "--beam_size=1",
                            "--max_decode_length=40", f"--output={tmp_path / 'hypotheses.txt'}")
  assert result.returncode == 0, result.stderr[-3000:]
  hypotheses = (tmp_path / "hypotheses.txt").read_text().splitlines()
  assert hypotheses[:20] == expected["outputs"][:20]
  bleu = sacrebleu.corpus_bleu(hypotheses, [pathlib.Path(ref).read_text().splitlines()]).score
  assert json.loads(result.stdout.strip().splitlines()[-1])["bleu"] == pytest.approx(bleu)
  assert bleu < 100


def test_its_int8_xla_saved_model_translates_as_the_model_directory(imported, tmp_path):
  """int8 weights, XLA-compiled (the export's default search): every output as
  transformers'."""
  model_dir, _ = imported
  expected = EXPECTED["greedy"]
  result = testutil.run_cli("tf_transformer.bin.export_saved_model", f"--model_dir={model_dir}",
                            f"--export_dir={tmp_path / 'export'}", "--beam_size=1",
                            "--max_decode_length=40", "--precision=int8", "--decode_jit",
                            "--signatures=serving_default")
  assert result.returncode == 0, result.stderr[-3000:]
  version = pathlib.Path(result.stdout.strip().splitlines()[-1])
  outputs = tf.saved_model.load(str(version)).signatures["serving_default"](
      inputs=tf.constant(expected["sources"]))["outputs"].numpy()
  assert [text.decode() for text in outputs.reshape(-1)] == expected["outputs"]


def test_its_ctranslate2_export_decodes_as_transformers(imported, loaded, tmp_path):
  import ctranslate2

  model_dir, ours = imported
  _, vocabulary = loaded
  result = testutil.run_cli("tf_transformer.bin.export_ctranslate2", f"--model_dir={model_dir}",
                            f"--output_dir={tmp_path / 'ct2'}")
  assert result.returncode == 0, result.stderr[-3000:]
  expected = EXPECTED["greedy"]
  rows = vocabulary.source.tokenize(tf.constant(expected["sources"])).to_list()
  pieces = [[p.decode() for p in vocabulary.source.id_to_string(row).numpy()] for row in rows]
  translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
  results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=40)
  table = json.loads((model_dir / "vocab.pieces.json").read_text())
  got = [[table.index(piece) for piece in result.hypotheses[0]] for result in results]
  want = [[ours[i] for i in ids[1:-1]] for ids in expected["output_ids"]]  # no start, no EOS
  assert got == want


def _swapped(texts, first, second):
  """`texts` with the words `first` and `second` swapped wherever they stand."""
  swap = {first: second, second: first}
  return [" ".join(swap.get(word, word) for word in text.split()) for text in texts]


def test_the_imported_model_fine_tunes_to_a_new_domain(imported, tmp_path):
  """A new domain that translates two words the other way round (train: the greedy set's
  pairs; dev: the teacher-forced set's references, both with the two target words swapped):
  `train --init_from` the model directory, and the dev references become more probable."""
  import collections

  import tf_transformer

  model_dir, _ = imported
  sources, references = EXPECTED["greedy"]["sources"], EXPECTED["greedy"]["references"]
  counts = collections.Counter(word for text in references for word in text.split())
  first, second = [word for word, _ in counts.most_common(2)]
  dev_sources = EXPECTED["teacher_forced"]["sources"][:40]
  dev_targets = _swapped(EXPECTED["teacher_forced"]["targets"][:40], first, second)
  data = tmp_path / "data"
  data.mkdir()
  testutil.write_corpus(data, "train", sources, _swapped(references, first, second))
  testutil.write_corpus(data, "val", dev_sources, dev_targets)
  tuned = tmp_path / "tuned"
  result = testutil.run_cli(
      "tf_transformer.train", f"--init_from={model_dir}", f"--model_dir={tuned}",
      f"--data_dir={data}", "--src_lang=src", "--tgt_lang=tgt", "--train_steps=60",
      "--eval_every=60", "--save_every=60", "--warmup_steps=10", "--learning_rate=0.02",
      "--batch_tokens=512", "--max_length=64", "--eval_sentences=40", timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  before = np.mean(tf_transformer.load(str(model_dir)).score(dev_sources, dev_targets))
  after = np.mean(tf_transformer.load(str(tuned)).score(dev_sources, dev_targets))
  print(f"dev log-probability per sentence: {before:.3f} imported, {after:.3f} fine-tuned")
  assert after > before + 1.0, (before, after)


def test_its_saved_model_serves_with_a_shortlist_batching_and_terminology(imported, tmp_path):
  """float32 weights, a graph search (--nodecode_jit), a shortlist (its lexicon counted over
  pairs in the model's own pieces) and in-graph batching, in one export: serving_default writes
  transformers' greedy outputs; translate_constrained writes a word each row asks for, and a
  row that asks for none as serving_default."""
  model_dir, _ = imported
  expected = EXPECTED["greedy"]
  data = tmp_path / "data"
  data.mkdir()
  testutil.write_corpus(data, "train", expected["sources"] + EXPECTED["teacher_forced"]["sources"],
                        expected["references"] + EXPECTED["teacher_forced"]["targets"])
  result = testutil.run_cli(
      "tf_transformer.bin.export_saved_model", f"--model_dir={model_dir}",
      f"--export_dir={tmp_path / 'export'}", "--beam_size=1", "--max_decode_length=40",
      "--precision=float32", "--nodecode_jit", f"--shortlist_size={_SHORTLIST_SIZE}",
      f"--data_dir={data}", "--src_lang=src", "--tgt_lang=tgt", "--batching",
      "--batching_max_size=8", "--signatures=serving_default,translate_constrained")
  assert result.returncode == 0, result.stderr[-3000:]
  version = pathlib.Path(result.stdout.strip().splitlines()[-1])
  settings = json.loads((version / "assets.extra" / "decoding.json").read_text())
  assert (settings["precision"], settings["shortlist_size"]) == ("float32", _SHORTLIST_SIZE)
  assert settings["batching"]["max_batch_size"] == 8
  signatures = tf.saved_model.load(str(version)).signatures
  sources = expected["sources"]
  outputs = signatures["serving_default"](inputs=tf.constant(sources))["outputs"].numpy()
  assert [text.decode() for text in outputs.reshape(-1)] == expected["outputs"]
  # each even row asks for a target word its greedy output lacks; odd rows ask for nothing
  words = sorted({word.strip(".?") for text in expected["references"] for word in text.split()})
  terms = [next(word for word in words if word not in output.split()) if row % 2 == 0 else ""
           for row, output in enumerate(expected["outputs"])]
  constrained = signatures["translate_constrained"](
      inputs=tf.constant(sources), constraints=tf.constant(terms))["outputs"].numpy()[:, 0]
  for row, (term, text) in enumerate(zip(terms, constrained)):
    text = text.decode()
    if term:
      assert term in text.replace(".", " ").replace("?", " ").split(), (row, term, text)
    else:
      assert text == expected["outputs"][row], (row, text)
