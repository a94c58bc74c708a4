"""Make GPT-2 language-model examples (packed next-token windows) as HDF5 and TFRecord shards.

    python datasets/prepare_gpt2.py --output_dir DIR [--max_seq_length 1024] [--input_files FILE ...]

With no --input_files, the default corpus (the Python documentation's prose, shipped with
CPython) is used. An input file is text (one sentence per line, a blank line between
documents) or JSON lines (.jsonl: a "text" field per line, one document each). A byte-level
BPE vocab (--vocab_size pieces at most) is trained on the corpus and written as GPT-2's
encoder.json + vocab.bpe (and as one tokenizer.json with --tokenizer_json, as the llama
folders' data has it). DIR receives those, meta.json and train-*/eval-* shards as .h5
(PyTorch) and/or .tfrecord (TensorFlow) holding the same examples. A rerun skips complete
shards. On bad input prints "error: ..." to stderr and exits with status 2.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: its start-up chatter

from common.data.text.lm import DEFAULT_VOCAB_SIZE, prepare_lm
from common.errors import UserError

FORMAT_CHOICES = {"hdf5": ("hdf5",), "tfrecord": ("tfrecord",), "both": ("hdf5", "tfrecord")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="folder for encoder.json, vocab.bpe, meta.json, shards")
    parser.add_argument("--max_seq_length", type=int, default=1024, help="tokens per example")
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE, help="size of the trained BPE (at most)")
    parser.add_argument("--input_files", nargs="*", default=[],
                        help="text or .jsonl files (default: the default corpus)")
    parser.add_argument("--json_field", default="text", help="the field holding the text in JSON lines")
    parser.add_argument("--format", choices=sorted(FORMAT_CHOICES), default="both",
                        help="hdf5 (PyTorch), tfrecord (TensorFlow) or both")
    parser.add_argument("--num_shards", type=int, default=1, help="training shards (eval has one)")
    parser.add_argument("--eval_fraction", type=float, default=0.1, help="share of the documents held out for eval")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--tokenizer_json", action="store_true",
                        help="also write the tokenizer as tokenizer.json (tokenizers.Tokenizer.from_file reads it)")
    args = parser.parse_args(argv)
    try:
        prepare_lm(
            args.output_dir,
            max_seq_length=args.max_seq_length,
            vocab_size=args.vocab_size,
            input_files=args.input_files,
            field=args.json_field,
            formats=FORMAT_CHOICES[args.format],
            num_shards=args.num_shards,
            seed=args.seed,
            eval_fraction=args.eval_fraction,
            tokenizer_json=args.tokenizer_json,
        )
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
