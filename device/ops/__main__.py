"""python -m device.ops [--write-readme]: print the op table, or rewrite it in device/README.md."""

import argparse

from device.ops.table import README, markdown_table, write_readme

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--write-readme", action="store_true", help=f"rewrite the op table in {README}")
if parser.parse_args().write_readme:
    write_readme()
    print(f"wrote the op table of {README}")
else:
    print(markdown_table())
