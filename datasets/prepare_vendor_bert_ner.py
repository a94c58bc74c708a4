"""Make a stand-in NER set in the vendor's CSV layout, for a migrated vendor BERT token classifier folder.

    python datasets/prepare_vendor_bert_ner.py --output_dir DIR [--max_sequence_length 128]

Not the benchmark set (BC5CDR-chem): a runnable stand-in from the default corpus (the
Python documentation's prose, shipped with CPython), labelled by a stated rule
(common/data/vendor/ner.py): a word printed as the name of a Python builtin (len,
ValueError, None, ...) is an entity, B for the first of a run and I for the rest, every
other word O, a word's later WordPiece pieces X. Writes what the vendor's
BertTokenClassifierDataProcessor reads: DIR/vocab.txt (uncased WordPiece, one token a
line), DIR/train/ (label2id.json, meta.dat, ner-1.csv ..) and DIR/dev/ (meta.dat,
ner-1.csv ..), CSV columns tokens and labels, each space-separated, [CLS] ... [SEP]. The
last lines give the config keys to set. With --format tfrecords, the layout its TF token
classifier reads (NerDataProcessor): DIR/train/ (label2id.json, ner-1.tfrecords ..) and
DIR/dev/ (ner-1.tfrecords ..), each example input_ids, input_mask, segment_ids and
label_ids, padded to max_sequence_length. DIR must be new or empty (nothing is overwritten).
On bad input prints "error: ..." to stderr and exits with status 2.
"""

import argparse
import sys
from pathlib import Path

from common.data.vendor.ner import LABELS, prepare_vendor_bert_ner
from common.errors import UserError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="a new or empty folder")
    parser.add_argument("--max_sequence_length", type=int, default=128, help="pieces per row, [CLS] and [SEP] included")
    parser.add_argument("--vocab_size", type=int, default=8192, help="size of the trained WordPiece vocab (at most)")
    parser.add_argument("--num_files", type=int, default=1,
                        help="CSV files of the training split (at least the config's train_input.num_workers)")
    parser.add_argument("--num_eval_files", type=int, default=1,
                        help="CSV files of the dev split (at least the config's eval_input.num_workers)")
    parser.add_argument("--eval_fraction", type=float, default=0.2, help="share of the documents held out for dev")
    parser.add_argument("--max_documents", type=int, help="use only the first N documents of the corpus")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--format", choices=("csv", "tfrecords"), default="csv",
                        help="csv for the vendor's PyTorch token classifier, tfrecords for its TF one")
    args = parser.parse_args(argv)
    try:
        made = prepare_vendor_bert_ner(args.output_dir, max_sequence_length=args.max_sequence_length,
                                       vocab_size=args.vocab_size, num_files=args.num_files,
                                       num_eval_files=args.num_eval_files, eval_fraction=args.eval_fraction,
                                       max_documents=args.max_documents, seed=args.seed, format=args.format)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    out = Path(args.output_dir).resolve()
    if args.format == "tfrecords":  # the TF folder reads the vocab's size from vocab_file
        print("set in the vendor's TF params (train_input and eval_input):")
        print(f"  train_input.data_dir={out / 'train'} eval_input.data_dir={out / 'dev'} "
              f"vocab_file={out / 'vocab.txt'} label_vocab_file={out / 'train' / 'label2id.json'} "
              f"max_sequence_length={args.max_sequence_length} model.num_classes={len(LABELS)}")
        return 0
    print("set in the vendor config (train_input and eval_input):")
    print(f"  train_input.data_dir={out / 'train'} eval_input.data_dir={out / 'dev'} vocab_file={out / 'vocab.txt'} "
          f"label_vocab_file={out / 'train' / 'label2id.json'} max_sequence_length={args.max_sequence_length} "
          f"do_lower=True model.vocab_size={made['vocab_size']} model.num_classes={len(LABELS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
