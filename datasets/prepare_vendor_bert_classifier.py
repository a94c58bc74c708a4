"""Make stand-ins for SST-2 or MNLI in the vendor's GLUE TSV files, for a migrated vendor BERT classifier folder.

    python datasets/prepare_vendor_bert_classifier.py --output_dir DIR [--task sst2|mnli]

Not the benchmark sets: runnable stand-ins from the default corpus (the Python
documentation's prose, shipped with CPython), labelled by a stated rule
(common/data/vendor/classifier.py): sst2, a sentence's label (0/1) is which of two pydoc
topics it is printed in; mnli, for a premise sentence, entailment is its own first half,
neutral the sentence after it, contradiction a sentence of another document. The files are
the vendor's exactly: DIR/SST-2/{train,dev}.tsv (sentence, label) or
DIR/MNLI/{train,dev_matched,dev_mismatched}.tsv (sentence1, sentence2, gold_label),
tab-separated with a header and no quoting, and DIR/vocab.txt, an uncased WordPiece vocab
trained on the corpus (one token a line). The last lines give the config keys to set. DIR
must be new or empty (nothing is overwritten). On bad input prints "error: ..." to stderr
and exits with status 2.
"""

import argparse
import sys
from pathlib import Path

from common.data.vendor.classifier import TASKS, prepare_vendor_bert_classifier
from common.errors import UserError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="a new or empty folder")
    parser.add_argument("--task", default="sst2", help=f"one of {', '.join(TASKS)}")
    parser.add_argument("--vocab_size", type=int, default=8192, help="size of the trained WordPiece vocab (at most)")
    parser.add_argument("--max_documents", type=int,
                        help="use only the first N documents of the corpus (sst2: for the vocab only)")
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)
    try:
        made = prepare_vendor_bert_classifier(args.output_dir, task=args.task, vocab_size=args.vocab_size,
                                              max_documents=args.max_documents, seed=args.seed)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    vocab = Path(args.output_dir).resolve() / "vocab.txt"
    print("set in the vendor config (train_input and eval_input):")
    print(f"  data_dir={made['data_dir']} vocab_file={vocab} do_lower=True model.vocab_size={made['vocab_size']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
