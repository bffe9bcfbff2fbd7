"""Print the README's demo tables from a measurement folder, or check the README against its folders.

    python -m clid.tables docs/measurements/<date>-demo     # the Markdown to paste between the README's markers
    python -m clid.tables --check README.md                 # exit 1 where a generated block differs
    python -m clid.tables --can-write FOLDER                # exit 1 where 07 --tables could not write there

The folder's files are written by ``07_eval.py --combine ... --tables FOLDER`` (clid/evaluation/tables.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from clid.base.files import DataError
from clid.evaluation.tables import check_tables_folder, markdown, readme_blocks, readme_problems
from clid.run.cli import HelpFormatter, run_main


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m clid.tables", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("folder", nargs="?", help="a measurement folder (07 --combine --tables, or a benchmark folder written by bench/*.py --out)")
    parser.add_argument("--check", metavar="README", help="compare the README's generated blocks with their folders "
                                                          "(relative to the README's folder)")
    parser.add_argument("--can-write", metavar="FOLDER", help="check, before a long run, that 07 --combine --tables "
                                                              "could write its tables into FOLDER")
    args = parser.parse_args(argv)
    if sum(value is not None for value in (args.folder, args.check, args.can_write)) != 1:
        parser.error("give a measurement folder, --check README or --can-write FOLDER, one of them")
    if args.can_write:
        check_tables_folder(args.can_write)
        print(f"{args.can_write}: 07 --tables can write its tables here")
        return
    if args.folder:
        print(f"<!-- tables: {args.folder} -->\n{markdown(args.folder)}<!-- end tables -->")
        return
    readme = Path(args.check)
    blocks = readme_blocks(readme.read_text(encoding="utf-8"))
    if problems := readme_problems(readme, readme.parent):
        raise DataError(readme, None, "; ".join(problems))
    print(f"{readme}: {len(blocks)} generated table block(s), each as its folder prints it")


if __name__ == "__main__":
    run_main(main)
