"""Make T5 pretraining text in the vendor's layout (pieces a line, meta.dat), for a migrated vendor T5 folder.

    python datasets/prepare_vendor_t5.py --output_dir DIR [--framework pytorch|tf] [--vocab_size 4096] [--num_files 8]

From the default corpus (the Python documentation's prose, shipped with CPython) and a
SentencePiece-style unigram vocab trained on it (<pad> </s> <unk> <s> first, as T5's),
writes what the vendor's T5DynamicDataProcessor reads (common/data/vendor/text.py):
DIR/vocab.txt (one piece a line), DIR/train/ and DIR/eval/ (meta.dat, c4-1.txt ..
c4-K.txt), a line a stretch of --sentences_per_line sentences of one document, its pieces
separated by spaces. The vendor's reader makes the span-corruption examples itself, with
extra_ids sentinels past the vocab's last id. The last lines give the config keys to set:
the PyTorch folder's (src_data_dir, src_vocab_file, model.src_vocab_size), or with
--framework tf the TF folder's (data_dir, vocab_file; it counts the vocab itself), which
reads the same files (DIR/<split>/*.txt).
DIR must be new or empty (nothing is overwritten). On bad input prints "error: ..." to
stderr and exits with status 2.
"""

import argparse
import sys
from pathlib import Path

from common.data.vendor.text import prepare_vendor_t5
from common.errors import UserError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="a new or empty folder")
    parser.add_argument("--framework", choices=("pytorch", "tf"), default="pytorch",
                        help="whose config keys the last line gives: the vendor's PyTorch t5 folder's or its TF one's")
    parser.add_argument("--vocab_size", type=int, default=4096, help="size of the trained vocab (at most)")
    parser.add_argument("--num_files", type=int, default=8,
                        help="text files of the training split (at least the config's train_input.num_workers)")
    parser.add_argument("--num_eval_files", type=int, default=8,
                        help="text files of the eval split (at least the config's eval_input.num_workers)")
    parser.add_argument("--sentences_per_line", type=int, default=4, help="sentences of a document a line holds")
    parser.add_argument("--eval_fraction", type=float, default=0.1, help="share of the lines held out for eval")
    parser.add_argument("--max_documents", type=int, help="use only the first N documents of the corpus")
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)
    try:
        made = prepare_vendor_t5(args.output_dir, vocab_size=args.vocab_size, num_files=args.num_files,
                                 num_eval_files=args.num_eval_files, sentences_per_line=args.sentences_per_line,
                                 eval_fraction=args.eval_fraction, max_documents=args.max_documents, seed=args.seed)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    out = Path(args.output_dir).resolve()
    print("set in the vendor config (extra_ids: 100 as its configs have it; batch_size at most the lines of a split):")
    if args.framework == "tf":
        print(f"  train_input.data_dir={out / 'train'} eval_input.data_dir={out / 'eval'} "
              f"vocab_file={out / 'vocab.txt'}")
        return 0
    print(f"  train_input.src_data_dir={out / 'train'} eval_input.src_data_dir={out / 'eval'} "
          f"src_vocab_file={out / 'vocab.txt'} model.src_vocab_size={made['vocab_size'] + 100}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
