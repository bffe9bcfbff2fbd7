"""The library raises; only the entry points exit. A ``sys.exit(...)`` or a ``SystemExit`` in ``clid/`` would end
a notebook's cell past ``except Exception``: the count outside the entry points is 0."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The sites that may exit, and why:
ALLOWED_FUNCTIONS = {
    # run_main is every command's entry point: it turns a DataError, an OSError or Stopped into the
    # shell's one line and exit status, and passes on a script's own ``sys.exit("error: ...")``
    ("clid/run/cli.py", "run_main"),
    # run_main's helper that prints that line (rank 0 alone under torchrun) and exits 1; nothing else calls it
    ("clid/run/cli.py", "error_exit"),
}
# clid/__init__.py checks at import that torch is there: an interpreter without the requirements gets one line
# naming the fix, not a traceback, before any entry point could catch anything (python -m clid.X imports the
# package first); nothing of clid can run in it, so there is no caller whose error this would take away
ALLOWED_IMPORT_CHECK = "clid/__init__.py"


def is_main_block(node: ast.AST) -> bool:
    """``if __name__ == "__main__":``, a script's or command's entry point."""
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__")


def is_exit(node: ast.AST) -> bool:
    """A use of ``SystemExit``, or a call of ``sys.exit`` / ``exit`` / ``quit`` / ``os._exit``."""
    if isinstance(node, ast.Name) and node.id == "SystemExit":
        return True
    if isinstance(node, ast.Attribute) and node.attr == "SystemExit":
        return True
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("exit", "quit"):
            return True
        if isinstance(func, ast.Attribute) and func.attr in ("exit", "_exit") and isinstance(func.value, ast.Name) \
                and func.value.id in ("sys", "_sys", "os"):
            return True
    return False


def exit_sites(source: str, path: str) -> list[str]:
    """``path:line`` of each exit in ``source`` outside the allowed sites."""
    sites = []

    def visit(node: ast.AST, function: str | None) -> None:
        if is_main_block(node) or (path, function) in ALLOWED_FUNCTIONS:
            return
        if isinstance(node, (ast.If, ast.Try)) and path == ALLOWED_IMPORT_CHECK and function is None:
            return
        if is_exit(node):
            sites.append(f"{path}:{node.lineno}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name if function is None else function
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), None)
    return sites


def test_the_counter_finds_exits_and_allows_only_the_entry_points():
    planted = ("import sys\n"
               "def read(path):\n"
               "    if not path:\n"
               "        sys.exit('error: no path')\n"
               "    try:\n"
               "        return open(path)\n"
               "    except OSError as err:\n"
               "        raise SystemExit(f'error: {err}') from None\n"
               "class Reader:\n"
               "    def close(self):\n"
               "        exit(1)\n"
               "def run_main(main):\n"
               "    sys.exit(main())\n"
               "if __name__ == '__main__':\n"
               "    sys.exit(read(sys.argv[1]))\n")
    assert exit_sites(planted, "clid/data/reader.py") == ["clid/data/reader.py:4", "clid/data/reader.py:8",
                                                          "clid/data/reader.py:11", "clid/data/reader.py:13"]
    assert exit_sites(planted, "clid/run/cli.py") == ["clid/run/cli.py:4", "clid/run/cli.py:8", "clid/run/cli.py:11"]
    # the import-time check is allowed in clid/__init__.py alone, and only at its top level
    check = "import importlib.util\nif importlib.util.find_spec('torch') is None:\n    import sys\n    raise SystemExit('error: no torch')\n"
    assert exit_sites(check, "clid/__init__.py") == [] and exit_sites(check, "clid/base/files.py") == ["clid/base/files.py:4"]
    assert exit_sites("def f():\n" + textwrap.indent(check, "    "), "clid/__init__.py") == ["clid/__init__.py:5"]


def test_no_exit_in_the_library_outside_its_entry_points():
    files = sorted((ROOT / "clid").rglob("*.py"))
    assert len(files) > 50  # the whole package is read
    sites = [site for f in files for site in exit_sites(f.read_text(encoding="utf-8"), f.relative_to(ROOT).as_posix())]
    assert sites == []


def test_the_allowed_sites_exist():
    """An allowed site that is gone is dropped from the list, not kept as a hole for a new exit."""
    cli = ast.parse((ROOT / "clid/run/cli.py").read_text(encoding="utf-8"))
    functions = {node.name: node for node in ast.walk(cli) if isinstance(node, ast.FunctionDef)}
    for path, name in ALLOWED_FUNCTIONS:
        assert path == "clid/run/cli.py" and any(is_exit(n) for n in ast.walk(functions[name])), name
    init = ast.parse((ROOT / ALLOWED_IMPORT_CHECK).read_text(encoding="utf-8"))
    assert any(isinstance(node, (ast.If, ast.Try)) and any(is_exit(n) for n in ast.walk(node)) for node in init.body)
