"""Make encoder-decoder examples (Transformer, T5) as HDF5 and TFRecord shards.

    python datasets/prepare_seq2seq.py --output_dir DIR [--task reversal|parallel|span_corruption]
        [--source_length 64] [--target_length N] [--input_files FILE ...]

Tasks: ``reversal`` (default): each sentence of the corpus (default: the Python
documentation's prose, shipped with CPython) to its words in reverse order, one right
answer per example; ``parallel``: translation data as WMT ships it, --input_files SOURCE
TARGET (two line-aligned UTF-8 files, e.g. train.en train.de); ``span_corruption``: T5's
pretraining objective over the corpus (15 % of the tokens dropped in spans of mean length
3, each span one sentinel). A tokenizer is trained on the text (a shared byte-level BPE,
<pad> <s> </s> = 0 1 2; for span_corruption a unigram model, <pad> </s> <unk> = 0 1 2, and
100 sentinels <extra_id_K>, <extra_id_0> the last id) and written as tokenizer.json. DIR
receives it, meta.json and train-*/eval-* shards as .h5 (PyTorch) and/or .tfrecord
(TensorFlow) holding the same examples. Pairs longer than the lengths are left out and
counted, never cut. A rerun skips complete shards. On bad input prints "error: ..." to
stderr and exits with status 2.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: its start-up chatter

from common.data.text.seq2seq import DEFAULT_VOCAB_SIZE, TASKS, prepare_seq2seq
from common.errors import UserError

FORMAT_CHOICES = {"hdf5": ("hdf5",), "tfrecord": ("tfrecord",), "both": ("hdf5", "tfrecord")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="folder for tokenizer.json, meta.json, shards")
    parser.add_argument("--task", choices=TASKS, default="reversal")
    parser.add_argument("--source_length", type=int, default=64, help="encoder tokens per example")
    parser.add_argument("--target_length", type=int, default=None,
                        help="decoder tokens per example (default: source_length; span_corruption: T5's rule)")
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE, help="size of the trained vocab")
    parser.add_argument("--input_files", nargs="*", default=[],
                        help="reversal, span_corruption: text or .jsonl corpora (default: the default corpus); "
                             "parallel: SOURCE TARGET")
    parser.add_argument("--json_field", default="text", help="the field holding the text in JSON lines")
    parser.add_argument("--format", choices=sorted(FORMAT_CHOICES), default="both",
                        help="hdf5 (PyTorch), tfrecord (TensorFlow) or both")
    parser.add_argument("--num_shards", type=int, default=1, help="training shards (eval has one)")
    parser.add_argument("--eval_fraction", type=float, default=0.1, help="share held out for eval")
    parser.add_argument("--noise_density", type=float, default=0.15, help="span_corruption: share of tokens dropped")
    parser.add_argument("--mean_noise_span_length", type=float, default=3.0, help="span_corruption: mean span")
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)
    try:
        prepare_seq2seq(
            args.output_dir,
            task=args.task,
            source_length=args.source_length,
            target_length=args.target_length,
            vocab_size=args.vocab_size,
            input_files=args.input_files,
            field=args.json_field,
            formats=FORMAT_CHOICES[args.format],
            num_shards=args.num_shards,
            seed=args.seed,
            eval_fraction=args.eval_fraction,
            noise_density=args.noise_density,
            mean_noise_span_length=args.mean_noise_span_length,
        )
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
