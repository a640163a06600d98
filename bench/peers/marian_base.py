"""The peers' side of bench/marian_speed.py: an OPUS-MT-sized Marian model in the Hugging Face
format, and the speed of transformers' `generate` and of CTranslate2 on it. It runs in the peers'
environment (../shared/bench/peers/setup.sh, with sentencepiece), not in this project's.

    /tmp/peerenv/bin/python bench/peers/marian_base.py build --out=DIR --source=EN --target=DE
    /tmp/peerenv/bin/python bench/peers/marian_base.py time --system=hf|ct2|ct2_int8 \
        --model=DIR --texts=FILE --batch_size=32 --beam=4 --length=30

`build` writes DIR/hf, the folder OPUS-MT publishes (config.json, model.safetensors, source.spm,
target.spm, vocab.json, the tokenizer's files), with Helsinki-NLP/opus-mt-en-de's dimensions
(6 + 6 layers, d_model 512, 8 heads, feed-forward 2048, swish, 58,101 ids, shared embeddings,
sinusoids, post-norm) and random weights (transformers' own initialisation, seed 1). Its two
SentencePiece models (up to 8,000 pieces each) are trained on the lines of EN and DE; the joint
vocab.json holds the pieces of both and is filled with unused pieces up to 58,101 ids, so that the
output layer has OPUS-MT's size. Then DIR/ct2 is CTranslate2's own conversion of DIR/hf
(ctranslate2.converters.TransformersConverter), float32.

`time` translates the lines of FILE string to string (tokenization and detokenization inside the
clock, as a SavedModel's signature has them), in batches of --batch_size, every output exactly
--length target pieces (minimum = maximum length: every system runs the same decoder steps; the
end-of-sentence and pad ids are barred until then). One untimed pass, then --repeats timed ones;
prints one JSON line.
"""

import argparse
import json
import os
import statistics
import time

VOCABULARY_SIZE = 58101  # Helsinki-NLP/opus-mt-en-de's
PIECES_EACH = 8000


def peak_rss_mib():
  """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited from the
  process that started it)."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) / 1024


def _train_spm(lines_path, prefix):
  import sentencepiece as spm
  spm.SentencePieceTrainer.train(input=lines_path, model_prefix=prefix, vocab_size=PIECES_EACH,
                                 model_type="unigram", character_coverage=1.0, num_threads=2,
                                 minloglevel=2, input_sentence_size=200000,
                                 shuffle_input_sentence=True, hard_vocab_limit=False)
  return prefix + ".model"


def build(args):
  import shutil
  import tempfile

  import ctranslate2.converters
  import sentencepiece as spm
  import torch
  from transformers import MarianConfig, MarianMTModel, MarianTokenizer

  hf_dir = os.path.join(args.out, "hf")
  os.makedirs(hf_dir, exist_ok=True)
  with tempfile.TemporaryDirectory() as scratch:
    for name, lines in (("source", args.source), ("target", args.target)):
      model = _train_spm(lines, os.path.join(scratch, name))
      shutil.copyfile(model, os.path.join(hf_dir, f"{name}.spm"))
  pieces = []
  for name in ("source", "target"):
    processor = spm.SentencePieceProcessor(model_file=os.path.join(hf_dir, f"{name}.spm"))
    for i in range(processor.get_piece_size()):
      piece = processor.id_to_piece(i)
      if piece not in ("<unk>", "<s>", "</s>") and piece not in pieces:
        pieces.append(piece)
  vocab = {"</s>": 0, "<unk>": 1}
  for piece in pieces:
    vocab[piece] = len(vocab)
  while len(vocab) < VOCABULARY_SIZE - 1:
    vocab[f"\u2581unused{len(vocab)}"] = len(vocab)
  vocab["<pad>"] = len(vocab)
  with open(os.path.join(hf_dir, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump(vocab, f, ensure_ascii=False)
  tokenizer = MarianTokenizer(source_spm=os.path.join(hf_dir, "source.spm"),
                              target_spm=os.path.join(hf_dir, "target.spm"),
                              vocab=os.path.join(hf_dir, "vocab.json"))
  pad = VOCABULARY_SIZE - 1
  config = MarianConfig(
      vocab_size=VOCABULARY_SIZE, decoder_vocab_size=VOCABULARY_SIZE, d_model=512,
      encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
      encoder_ffn_dim=2048, decoder_ffn_dim=2048, activation_function="swish",
      max_position_embeddings=512, scale_embedding=True, pad_token_id=pad, eos_token_id=0,
      decoder_start_token_id=pad, forced_eos_token_id=0, share_encoder_decoder_embeddings=True,
      tie_word_embeddings=True, static_position_embeddings=True, normalize_before=False,
      dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
      architectures=["MarianMTModel"])
  torch.manual_seed(1)
  model = MarianMTModel(config).eval()
  model.save_pretrained(hf_dir)
  tokenizer.save_pretrained(hf_dir)
  ctranslate2.converters.TransformersConverter(hf_dir).convert(os.path.join(args.out, "ct2"),
                                                               force=True)
  print(json.dumps({"hf": hf_dir, "ct2": os.path.join(args.out, "ct2"),
                    "parameters": sum(p.numel() for p in model.parameters())}))


def _hf_translator(args):
  import torch
  from transformers import MarianMTModel, MarianTokenizer
  torch.set_num_threads(args.threads)
  hf_dir = os.path.join(args.model, "hf")
  tokenizer = MarianTokenizer.from_pretrained(hf_dir)
  model = MarianMTModel.from_pretrained(hf_dir).eval()

  def translate(texts):
    with torch.inference_mode():
      inputs = tokenizer(texts, return_tensors="pt", padding=True)
      outputs = model.generate(**inputs, num_beams=args.beam, do_sample=False,
                               min_new_tokens=args.length, max_new_tokens=args.length,
                               bad_words_ids=[[model.config.pad_token_id]],
                               forced_eos_token_id=None)
      assert outputs.shape[1] == args.length + 1, outputs.shape  # + the decoder start
      return tokenizer.batch_decode(outputs, skip_special_tokens=True)
  return translate, {"torch": torch.__version__}


def _ct2_translator(args):
  import ctranslate2
  import sentencepiece as spm
  hf_dir = os.path.join(args.model, "hf")
  source = spm.SentencePieceProcessor(model_file=os.path.join(hf_dir, "source.spm"))
  target = spm.SentencePieceProcessor(model_file=os.path.join(hf_dir, "target.spm"))
  translator = ctranslate2.Translator(
      os.path.join(args.model, "ct2"), device="cpu", inter_threads=1,
      intra_threads=args.threads, compute_type="int8" if args.system == "ct2_int8" else "float32")

  def translate(texts):
    pieces = [p + ["</s>"] for p in source.encode(texts, out_type=str)]
    results = translator.translate_batch(pieces, beam_size=args.beam,
                                         min_decoding_length=args.length,
                                         max_decoding_length=args.length, max_batch_size=0)
    outputs = [r.hypotheses[0] for r in results]
    assert all(len(o) == args.length for o in outputs), [len(o) for o in outputs]
    return [target.decode_pieces(o) for o in outputs]
  return translate, {"ctranslate2": ctranslate2.__version__}


def time_system(args):
  with open(args.texts, encoding="utf-8") as f:
    texts = [line.rstrip("\n") for line in f]
  make = _hf_translator if args.system == "hf" else _ct2_translator
  translate, versions = make(args)
  batches = [texts[i:i + args.batch_size] for i in range(0, len(texts), args.batch_size)]

  def run_pass():
    return [output for batch in batches for output in translate(batch)]
  run_pass()
  times = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    run_pass()
    times.append(time.perf_counter() - start)
  median = statistics.median(times)
  print(json.dumps({"system": args.system, "pass_s": times, "sent_per_s": len(texts) / median,
                    "tgt_tok_per_s": len(texts) * args.length / median,
                    "peak_rss_mib": peak_rss_mib(),
                    **versions}))


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  commands = parser.add_subparsers(dest="command", required=True)
  build_parser = commands.add_parser("build")
  build_parser.add_argument("--out", required=True)
  build_parser.add_argument("--source", required=True, help="source-language lines (spm)")
  build_parser.add_argument("--target", required=True, help="target-language lines (spm)")
  time_parser = commands.add_parser("time")
  time_parser.add_argument("--system", choices=["hf", "ct2", "ct2_int8"], required=True)
  time_parser.add_argument("--model", required=True, help="build's --out")
  time_parser.add_argument("--texts", required=True, help="source lines to translate")
  time_parser.add_argument("--batch_size", type=int, default=32)
  time_parser.add_argument("--beam", type=int, default=4)
  time_parser.add_argument("--length", type=int, default=30)
  time_parser.add_argument("--repeats", type=int, default=1)
  time_parser.add_argument("--threads", type=int, default=2)
  args = parser.parse_args()
  build(args) if args.command == "build" else time_system(args)


if __name__ == "__main__":
  main()
