"""Make GPT-2 language-model examples in the vendor's layouts, for the GPT folders of the vendor's zoo.

    python datasets/prepare_vendor_gpt2.py --output_dir DIR [--format hdf5|tfrecords] [--max_seq_length 1024]
                                           [--input_files FILE ...]

The examples are prepare_gpt2.py's (the same corpus, tokenizer and packing; the default
corpus without --input_files), written in DIR as that script writes them and again in the
layout the vendor's GptHDF5DataProcessor reads: DIR/train/gpt2-1.h5 .. gpt2-K.h5 (K =
--num_files) and DIR/eval/gpt2-1.h5, each file an ``n_examples`` attribute and datasets
example_0, example_1, ... of int32 (3, max_seq_length) (common/data/vendor/gpt2.py). With
--format tfrecords, the layout its TF gpt2, gpt3 and gptj folders read (GptTfRecordsProcessor):
DIR/train/gpt2-1.tfrecords .., each example input_ids, input_mask and labels. The
last line gives the overrides that point a migrated folder at them. On bad input prints
"error: ..." to stderr and exits with status 2.
"""

import argparse
import sys

from common.data.text.lm import DEFAULT_VOCAB_SIZE
from common.data.vendor.gpt2 import prepare_vendor_lm
from common.errors import UserError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="folder for the tokenizer, meta.json, train/ and eval/")
    parser.add_argument("--max_seq_length", type=int, default=1024, help="tokens per example")
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE, help="size of the trained BPE (at most)")
    parser.add_argument("--input_files", nargs="*", default=[],
                        help="text or .jsonl files (default: the default corpus)")
    parser.add_argument("--json_field", default="text", help="the field holding the text in JSON lines")
    parser.add_argument("--num_files", type=int, default=1, help="files of the training split (eval has one)")
    parser.add_argument("--eval_fraction", type=float, default=0.1, help="share of the documents held out for eval")
    parser.add_argument("--format", choices=("hdf5", "tfrecords"), default="hdf5",
                        help="hdf5 for the vendor's PyTorch GPT-2, tfrecords for its TF gpt2, gpt3 and gptj")
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)
    try:
        prepare_vendor_lm(
            args.output_dir,
            max_seq_length=args.max_seq_length,
            vocab_size=args.vocab_size,
            input_files=args.input_files,
            field=args.json_field,
            num_files=args.num_files,
            seed=args.seed,
            eval_fraction=args.eval_fraction,
            format=args.format,
        )
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
