"""Make BERT pretraining examples (masked LM + next sentence) as TFRecords and HDF5 shards.

    python datasets/prepare_bert.py --output_dir DIR [--input FILE ...] [--vocab_file vocab.txt]

With no --input, the default corpus (the Python documentation's prose, shipped with
CPython) is used. An --input is a text file (one sentence per line, a blank line between
documents) or JSON lines (.jsonl: a "text" field per line, one document each). With no
--vocab_file, a WordPiece vocab is trained on the corpus. DIR receives vocab.txt,
manifest.json and train-*/eval-* shards, each as .tfrecord (TensorFlow) and .hdf5
(PyTorch) holding the same examples. A rerun skips complete shards. On bad input prints
"error: ..." to stderr and exits with status 2.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: its start-up chatter

from common.data.text.pretraining import MaskingConfig
from common.data.text.prepare import FORMATS, prepare_bert
from common.errors import UserError


def main(argv=None) -> int:
    d = MaskingConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="folder for vocab.txt, manifest.json and the shards")
    parser.add_argument("--input", nargs="*", default=[], help="text or .jsonl files (default: the default corpus)")
    parser.add_argument("--json_field", default="text", help="the field holding the text in JSON lines")
    parser.add_argument("--vocab_file", help="a BERT vocab.txt or a tokenizer.json (default: train one)")
    parser.add_argument("--vocab_size", type=int, default=8192, help="size of the trained vocab (at most)")
    parser.add_argument("--do_lower_case", type=int, choices=(0, 1), default=1, help="1: uncased (default)")
    parser.add_argument("--max_seq_length", type=int, default=d.max_seq_length)
    parser.add_argument("--max_predictions_per_seq", type=int, default=d.max_predictions_per_seq)
    parser.add_argument("--masked_lm_prob", type=float, default=d.masked_lm_prob)
    parser.add_argument("--short_seq_prob", type=float, default=d.short_seq_prob)
    parser.add_argument("--dupe_factor", type=int, default=d.dupe_factor)
    parser.add_argument("--do_whole_word_mask", type=int, choices=(0, 1), default=0,
                        help="1: mask all WordPiece pieces of a word together")
    parser.add_argument("--random_seed", type=int, default=12345)
    parser.add_argument("--num_shards", type=int, default=4, help="training shards (eval has one)")
    parser.add_argument("--eval_percent", type=float, default=10.0, help="documents held out for eval")
    parser.add_argument("--formats", default=",".join(FORMATS), help="tfrecord, hdf5 or both (comma-separated)")
    args = parser.parse_args(argv)
    try:
        prepare_bert(
            args.output_dir,
            inputs=args.input,
            vocab_file=args.vocab_file,
            vocab_size=args.vocab_size,
            do_lower_case=bool(args.do_lower_case),
            masking=MaskingConfig(args.max_seq_length, args.max_predictions_per_seq, args.masked_lm_prob,
                                  args.short_seq_prob, args.dupe_factor, bool(args.do_whole_word_mask)),
            seed=args.random_seed,
            num_shards=args.num_shards,
            eval_percent=args.eval_percent,
            formats=[f.strip() for f in args.formats.split(",") if f.strip()],
            field=args.json_field,
        )
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
