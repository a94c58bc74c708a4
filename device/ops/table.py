"""The op table of device/README.md, generated from the records (never edited by hand).

    python -m device.ops                  print the table
    python -m device.ops --write-readme   rewrite it in device/README.md, between its markers

tests/device/test_ops.py fails while the README's table differs from the records.
"""

from __future__ import annotations

import os

from device.dtypes import DEVICE_DTYPES, FLOATS, INTEGERS
from device.ops.record import CATEGORIES, OpRecord

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
BEGIN = "<!-- op table: generated from device/ops/ by python -m device.ops --write-readme -->"
END = "<!-- end of op table -->"

# names of the dtype groups records use, for the table
_GROUPS = {tuple(FLOATS): "float", tuple(INTEGERS): "int", (*FLOATS, *INTEGERS): "number",
           tuple(DEVICE_DTYPES): "any"}


def _dtypes(record: OpRecord) -> str:
    groups = [_GROUPS.get(tuple(d), "/".join(d)) for d in record.dtypes]
    return ", ".join(groups) if len(set(groups)) > 1 else groups[0]


def _row(record: OpRecord) -> str:
    attrs = ", ".join(record.attrs) or "-"
    gradient = "yes" if record.backward is not None else "none"
    return (f"| `{record.name}` | {', '.join(record.inputs)} | {attrs} | {_dtypes(record)} | {record.category} "
            f"| {gradient} | {record.summary} |")


def markdown_table() -> str:
    from device.ops import FAMILIES  # the package imports this module's siblings, not this one

    lines = ["| op | inputs | attributes (? optional) | dtypes | category | gradient | computes |",
             "|---|---|---|---|---|---|---|"]
    for family in FAMILIES:
        lines += [_row(record) for record in family.RECORDS]
    lines += ["", "| category | matched into |", "|---|---|"]
    lines += [f"| {name} | {meaning} |" for name, meaning in CATEGORIES.items()]
    return "\n".join(lines)


def _split_readme() -> tuple[str, str, str]:
    with open(README) as f:
        text = f.read()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"{README} must hold the op table markers once each ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    return head, current, tail


def readme_table_is_current() -> bool:
    _, current, _ = _split_readme()
    return current.strip() == markdown_table()


def write_readme() -> None:
    head, _, tail = _split_readme()
    with open(README, "w") as f:
        f.write(f"{head}{BEGIN}\n{markdown_table()}\n{END}{tail}")
