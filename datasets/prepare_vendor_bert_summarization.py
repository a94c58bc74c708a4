"""Make a stand-in summarization set in the vendor's BertSum CSV layout, for its extractive summarization folder.

    python datasets/prepare_vendor_bert_summarization.py --output_dir DIR [--max_sequence_length 512]

Not the benchmark set (CNN/DailyMail): a runnable stand-in from the default corpus (the
Python documentation's prose, shipped with CPython), labelled by a stated rule
(common/data/vendor/summarization.py): an article is up to --sentences_per_article
consecutive sentences of a document, its summary the third of them that share the most
words with the rest. Writes what the vendor's BertSumCSVDataProcessor reads:
DIR/vocab.txt (uncased WordPiece, one token a line), DIR/train/ and DIR/valid/ (meta.dat,
bertsum-1.csv ..), columns input_token_ids, labels, segment_ids, cls_ids. The last lines
give the config keys to set. With --format tfrecords, the layout its TF folder reads
(BertSumTfRecordsProcessor): DIR/train/ and DIR/valid/ (bertsum-1.tfrecords ..), padded as
its TF writer pads them. DIR must be new or empty (nothing is overwritten). On bad
input prints "error: ..." to stderr and exits with status 2.
"""

import argparse
import sys
from pathlib import Path

from common.data.vendor.summarization import prepare_vendor_bert_summarization
from common.errors import UserError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="a new or empty folder")
    parser.add_argument("--max_sequence_length", type=int, default=512, help="pieces per article, at most")
    parser.add_argument("--sentences_per_article", type=int, default=12,
                        help="sentences of a document in an article (at most the config's max_cls_tokens)")
    parser.add_argument("--vocab_size", type=int, default=8192, help="size of the trained WordPiece vocab (at most)")
    parser.add_argument("--num_files", type=int, default=1,
                        help="CSV files of the training split (at least the config's train_input.num_workers)")
    parser.add_argument("--num_eval_files", type=int, default=1,
                        help="CSV files of the valid split (at least the config's eval_input.num_workers)")
    parser.add_argument("--eval_fraction", type=float, default=0.2, help="share of the documents held out for valid")
    parser.add_argument("--max_documents", type=int, help="use only the first N documents of the corpus")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--format", choices=("csv", "tfrecords"), default="csv",
                        help="csv for the vendor's PyTorch extractive summarization, tfrecords for its TF one")
    parser.add_argument("--max_cls_tokens", type=int, default=50,
                        help="--format tfrecords: sentences per article at most (its configs' max_cls_tokens)")
    args = parser.parse_args(argv)
    try:
        made = prepare_vendor_bert_summarization(
            args.output_dir, max_sequence_length=args.max_sequence_length,
            sentences_per_article=args.sentences_per_article, vocab_size=args.vocab_size, num_files=args.num_files,
            num_eval_files=args.num_eval_files, eval_fraction=args.eval_fraction, max_documents=args.max_documents,
            seed=args.seed, format=args.format, max_cls_tokens=args.max_cls_tokens)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    out = Path(args.output_dir).resolve()
    if args.format == "tfrecords":  # the TF folder reads the vocab's size from vocab_file
        print("set in the vendor's TF params (train_input and eval_input):")
        print(f"  train_input.data_dir={out / 'train'} eval_input.data_dir={out / 'valid'} "
              f"vocab_file={out / 'vocab.txt'} max_sequence_length={args.max_sequence_length} "
              f"max_cls_tokens={args.max_cls_tokens}")
        return 0
    print("set in the vendor config (train_input and eval_input):")
    print(f"  train_input.data_dir={out / 'train'} eval_input.data_dir={out / 'valid'} vocab_file={out / 'vocab.txt'} "
          f"max_sequence_length={args.max_sequence_length} model.vocab_size={made['vocab_size']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
