"""``python -m common.port migrate SRC --out DEST`` (and ``check PATH``): the same as ``zoo port ...``."""

import sys

from common.zoo_cli import main

if __name__ == "__main__":
    sys.exit(main(["port", *sys.argv[1:]]))
