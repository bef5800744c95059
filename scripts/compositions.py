"""Rewrite the generated tables of ``docs/compositions.md`` (between its ``compositions:begin`` and
``compositions:end`` markers) from ``fedlib.config.compositions.markdown()``, what ``RunConfig.validate`` says of
every combination; ``tests/test_compositions.py`` fails while the file and the library disagree:

    python scripts/compositions.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedlib.config import compositions

DOC = Path(__file__).resolve().parents[1] / "docs" / "compositions.md"
BEGIN, END = "<!-- compositions:begin -->", "<!-- compositions:end -->"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", type=Path, default=DOC, help=f"the page to update (default {DOC})")
    args = ap.parse_args(argv)
    text = args.doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{args.doc}: no {BEGIN} ... {END} block to replace")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    args.doc.write_text(f"{head}{BEGIN}\n{compositions.markdown()}{END}{tail}")
    print(f"{args.doc}: tables regenerated")


if __name__ == "__main__":
    main()
