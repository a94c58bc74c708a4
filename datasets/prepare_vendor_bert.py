"""Make BERT pretraining data in the vendor's CSV layout, for a migrated vendor BERT folder.

    python datasets/prepare_vendor_bert.py --output_dir DIR [--format csv|tfrecords] [--max_seq_length 128]
                                           [--num_files 8]

From the default corpus (the Python documentation's prose, shipped with CPython) and a
WordPiece vocab trained on it (uncased), writes what the vendor's BertCSVDynamicMaskDataProcessor
reads (common/data/vendor/text.py): DIR/vocab.txt (one token a line), DIR/train/ (meta.dat,
bert-1.csv .. bert-K.csv) and DIR/eval/ (meta.dat, bert-1.csv ..), rows of unmasked
[CLS] A [SEP] B [SEP] pairs with columns tokens, segment_ids, is_random_next. The last
lines give the config keys to set. With --format tfrecords, the layout the vendor's TF bert
folder reads (BertTfRecordsProcessor): this zoo's BERT pretraining TFRecords (prepare_bert.py's,
Google's features, masked once) in DIR, linked into DIR/train/ and DIR/eval/
(common/data/vendor/bert_tf.py). DIR must be new or empty (nothing is overwritten). On
bad input prints "error: ..." to stderr and exits with status 2.
"""

import argparse
import sys
from pathlib import Path

from common.data.vendor.bert_tf import prepare_vendor_bert_tfrecords
from common.data.vendor.text import prepare_vendor_bert
from common.errors import UserError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="a new or empty folder")
    parser.add_argument("--format", choices=("csv", "tfrecords"), default="csv",
                        help="csv for the vendor's PyTorch bert, tfrecords for its TF bert")
    parser.add_argument("--max_seq_length", type=int, default=128, help="tokens per example, at most")
    parser.add_argument("--max_predictions_per_seq", type=int, default=20,
                        help="masked positions per example, at most (--format tfrecords: the masking is static)")
    parser.add_argument("--vocab_size", type=int, default=8192, help="size of the trained WordPiece vocab (at most)")
    parser.add_argument("--num_files", type=int, default=8,
                        help="files of the training split (CSV: at least the config's train_input.num_workers)")
    parser.add_argument("--num_eval_files", type=int, default=1,
                        help="CSV files of the eval split (at least the config's eval_input.num_workers; "
                             "tfrecords: one)")
    parser.add_argument("--dupe_factor", type=int, default=2, help="passes over the documents, each cut anew")
    parser.add_argument("--short_seq_prob", type=float, default=0.1)
    parser.add_argument("--eval_fraction", type=float, default=0.1, help="share of the documents held out for eval")
    parser.add_argument("--max_documents", type=int, help="use only the first N documents of the corpus")
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)
    if args.format == "tfrecords":
        return _tfrecords(args)
    try:
        made = prepare_vendor_bert(args.output_dir, max_seq_length=args.max_seq_length, vocab_size=args.vocab_size,
                                   num_files=args.num_files, num_eval_files=args.num_eval_files,
                                   dupe_factor=args.dupe_factor,
                                   short_seq_prob=args.short_seq_prob, eval_fraction=args.eval_fraction,
                                   max_documents=args.max_documents, seed=args.seed)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    out = Path(args.output_dir).resolve()
    print("set in the vendor config (train_input and eval_input; model.vocab_size):")
    print(f"  train_input.data_dir={out / 'train'} eval_input.data_dir={out / 'eval'} "
          f"vocab_file={out / 'vocab.txt'} max_sequence_length={args.max_seq_length} do_lower=True "
          f"model.vocab_size={made['vocab_size']}")
    return 0


def _tfrecords(args) -> int:
    if args.max_documents is not None or args.num_eval_files != 1:
        option = "--max_documents" if args.max_documents is not None else "--num_eval_files"
        print(f"error: {option}: --format tfrecords takes the whole corpus and writes one eval file", file=sys.stderr)
        return 2
    try:
        made = prepare_vendor_bert_tfrecords(args.output_dir, max_seq_length=args.max_seq_length,
                                             max_predictions_per_seq=args.max_predictions_per_seq,
                                             vocab_size=args.vocab_size, num_files=args.num_files,
                                             dupe_factor=args.dupe_factor, short_seq_prob=args.short_seq_prob,
                                             eval_fraction=args.eval_fraction, seed=args.seed)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    out = Path(args.output_dir).resolve()
    print(f"set in the vendor's TF bert params (train_input and eval_input; vocab {made['vocab_size']:,}):")
    print(f"  train_input.data_dir={out / 'train'} eval_input.data_dir={out / 'eval'} "
          f"vocab_file={out / 'vocab.txt'} max_sequence_length={args.max_seq_length} "
          f"max_predictions_per_seq={args.max_predictions_per_seq}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
