"""Scores a model on a test set: `python -m tf_transformer.bin.evaluate --src F --ref F
(--saved_model=DIR | --flagfile=F --model_dir=DIR | --flagfile=F --ensemble=DIR1,DIR2[,...])`.

Prints sacreBLEU (with its signature), chrF and BLEU-1..4, writes the hypotheses to --output
(default hypotheses.txt) and ends with one JSON line of every figure.
"""

import json

from absl import flags

from tf_transformer.bin import cli, shared_flags

# --src also names other tools' inputs: whichever tool runs defines it
flags.DEFINE_string("src", None, "The test set's source side (plain or .gz).",
                    allow_override=True)
flags.DEFINE_string("ref", None, "Reference translations, line-aligned with --src.")

FLAGS = flags.FLAGS


def main(argv):
  cli.start(argv)
  from common import files
  from common.progress import ProgressBar
  from data_pipeline.corpora import read_parallel, scan_parallel
  from tf_transformer.training import metrics

  decode_config = shared_flags.decode_config_from_flags()
  search = shared_flags.per_call_search()
  scan = scan_parallel(FLAGS.src, FLAGS.ref)
  pairs = read_parallel(FLAGS.src, FLAGS.ref)
  model = shared_flags.model_from_flags(decode_config)
  sources, references = [list(side) for side in zip(*pairs)]
  path = FLAGS.output or "hypotheses.txt"
  with files.atomic_file(path) as f:
    progress = ProgressBar(len(sources), unit="sentence", label="decoding")
    # (the pairs read are the non-empty ones: numbered as lines when there is no other)
    with cli.reporting_cut_lines(FLAGS.src, "non-empty pair" if scan.empty_pairs else "line"):
      hypotheses = model.translate(sources, batch_size=FLAGS.batch_size, progress=progress,
                                   **search)
    progress.close()
    f.writelines(h + "\n" for h in hypotheses)
  results = metrics.report(hypotheses, references)
  print(f"{results['bleu_text']}  ({results['bleu_signature']})")
  print(f"chrF2 = {results['chrf']:.2f}  ({results['chrf_signature']})")
  print(" ".join(f"BLEU-{n} = {results[f'bleu_{n}']:.2f}" for n in range(1, 5)))
  print(json.dumps({**results, "sentences": len(hypotheses), "hypotheses": path,
                    "strategy": FLAGS.strategy,
                    "beam_size": None if FLAGS.saved_model else decode_config.beam_size}))


def run():
  cli.run(main, required_flags=("src", "ref"))


if __name__ == "__main__":
  run()
