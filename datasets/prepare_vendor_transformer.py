"""Make translation-shaped text in the vendor's layout (pieces a line, meta.dat), for a vendor Transformer folder.

    python datasets/prepare_vendor_transformer.py --output_dir DIR [--framework pytorch|tf] [--vocab_size 4096]

The pairs are the zoo's default sequence-to-sequence task when there is no parallel text
(common/data/text/seq2seq.py reversal_pairs): each sentence of the default corpus (the
Python documentation's prose, shipped with CPython), and as its "translation" the same
words in reverse order. A runnable stand-in with one right answer a pair, not WMT. One
byte-level BPE vocab (<pad> <s> </s> <unk> first) serves both sides, since the vendor's
TransformerDynamicDataProcessor looks the target's pieces up in src_vocab_file too. Writes
(common/data/vendor/text.py) DIR/vocab.txt (one piece a line) and, for train and eval,
DIR/<split>/src/ (meta.dat, text-K.src) and DIR/<split>/tgt/ (text-K.tgt), line k of a
.src and a .tgt a pair, pieces separated by spaces; meta.dat names the files by absolute
path, as the vendor's reader opens them as written (move DIR and prepare it again). The
last lines give the config keys to set: the PyTorch folder's, or with --framework tf the
TF folder's, whose reader takes src_data_dir and tgt_data_dir as glob patterns of the
same files (DIR/<split>/src/*.src, DIR/<split>/tgt/*.tgt: sorted, file K of each side
pairs up) and counts the vocab itself. DIR must be new or empty (nothing is
overwritten). On bad input prints "error: ..." to stderr and exits with status 2.
"""

import argparse
import sys
from pathlib import Path

from common.data.vendor.text import prepare_vendor_transformer
from common.errors import UserError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="a new or empty folder")
    parser.add_argument("--framework", choices=("pytorch", "tf"), default="pytorch",
                        help="whose config keys the last line gives: the vendor's PyTorch transformer folder's or "
                             "its TF one's")
    parser.add_argument("--vocab_size", type=int, default=4096, help="size of the trained BPE (at most)")
    parser.add_argument("--num_files", type=int, default=8,
                        help="file pairs of the training split (at least the config's train_input.num_workers)")
    parser.add_argument("--num_eval_files", type=int, default=8,
                        help="file pairs of the eval split (at least the config's eval_input.num_workers)")
    parser.add_argument("--eval_fraction", type=float, default=0.1, help="share of the pairs held out for eval")
    parser.add_argument("--max_documents", type=int, help="use only the first N documents of the corpus")
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)
    try:
        made = prepare_vendor_transformer(args.output_dir, vocab_size=args.vocab_size, num_files=args.num_files,
                                          num_eval_files=args.num_eval_files, eval_fraction=args.eval_fraction,
                                          max_documents=args.max_documents, seed=args.seed)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    out = Path(args.output_dir).resolve()
    vocab = out / "vocab.txt"
    print("set in the vendor config (batch_size at most the pairs of a split):")
    if args.framework == "tf":
        print(f"  train_input.src_data_dir={out / 'train/src/*.src'} "
              f"train_input.tgt_data_dir={out / 'train/tgt/*.tgt'} "
              f"eval_input.src_data_dir={out / 'eval/src/*.src'} eval_input.tgt_data_dir={out / 'eval/tgt/*.tgt'} "
              f"src_vocab_file={vocab} tgt_vocab_file={vocab}")
        return 0
    print(f"  train_input.src_data_dir={out / 'train/src'} train_input.tgt_data_dir={out / 'train/tgt'} "
          f"eval_input.src_data_dir={out / 'eval/src'} eval_input.tgt_data_dir={out / 'eval/tgt'} "
          f"src_vocab_file={vocab} tgt_vocab_file={vocab} "
          f"model.src_vocab_size={made['vocab_size']} model.tgt_vocab_size={made['vocab_size']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
