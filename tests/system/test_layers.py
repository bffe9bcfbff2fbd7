"""The package's architecture, checked: layers that import only downward (the import-linter contract in
pyproject.toml), no import cycle (imports inside functions counted), every module in one layer."""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("clid")


def contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["id"] == "layers")


def layer_members() -> list[list[str]]:
    return [[f"clid.{name.strip()}" for name in layer.replace("|", ":").split(":")] for layer in contract()["layers"]]


def test_the_layers_contract_is_kept():
    done = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0 and "KEPT" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


def test_every_module_sits_in_exactly_one_layer(graph):
    tops = [m for layer in layer_members() for m in layer]
    assert len(tops) == len(set(tops))
    for module in graph.modules:
        if module in ("clid", "clid._C"):  # (the package's own door, and the compiled kernels ops loads)
            continue
        homes = [top for top in tops if module == top or module.startswith(top + ".")]
        assert len(homes) == 1, f"{module} sits in {homes or 'no layer'}"


def strongly_connected(graph) -> list[set[str]]:
    """The groups of modules that import each other, in turn (Tarjan's algorithm, without recursion)."""
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index, low, on_stack, stack, groups, counter = {}, {}, set(), [], [], 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter; counter += 1; stack.append(start); on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter; counter += 1; stack.append(child); on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop(); on_stack.discard(member); group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups


def test_no_import_cycle(graph):
    assert strongly_connected(graph) == []


def test_the_cycle_finder_finds_one():
    toy = grimp.ImportGraph()
    for name in ("a", "a.x", "a.y", "a.z"):
        toy.add_module(name)
    toy.add_import(importer="a.x", imported="a.y")
    toy.add_import(importer="a.y", imported="a.x")
    toy.add_import(importer="a.z", imported="a.x")
    assert strongly_connected(toy) == [{"a.x", "a.y"}]


def code_map_modules(text: str) -> set[str]:
    """The modules a code map names: ``clid.x.y`` (``clid.x`` for ``x/__init__.py``, ``clid.x.__main__`` for
    ``x/__main__.py``) or ``clid/x/y.py``."""
    dotted = re.findall(r"(?<![\w/.])clid(?:\.[A-Za-z_]\w*)*(?![\w/])", text)
    paths = [path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
             for path in re.findall(r"(?<![\w/])clid/[\w/]*\w\.py\b", text)]
    return set(dotted) | set(paths)


def test_the_code_map_names_every_module():
    """docs/method.md's code map ("## The code" to the next heading of its level) names every .py file of clid/,
    and nothing that is not one."""
    text = (ROOT / "docs" / "method.md").read_text()
    start = text.index("\n## The code")
    end = text.find("\n## ", start + 1)
    named = code_map_modules(text[start:end if end >= 0 else None])
    modules = {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for path in (ROOT / "clid").rglob("*.py")}
    assert not modules - named, f"docs/method.md's code map does not name {sorted(modules - named)}"
    assert not named - modules, f"docs/method.md's code map names what is no module: {sorted(named - modules)}"


def test_the_code_map_reader_reads_both_spellings():
    assert code_map_modules("`clid.data.store` (`clid/base/__init__.py`, `clid/caption/__main__.py`), `clid`, "
                            "not clid_x or xclid.y") == {"clid.data.store", "clid.base", "clid.caption.__main__", "clid"}
