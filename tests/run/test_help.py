"""`--help` of every command line: every flag explained in words, its default shown once, and the
numbered scripts' flags in named groups.

The command lines: the numbered stage scripts, the bench scripts and every ``clid`` module that
runs as ``python -m clid.X``, found on disk so that a new one (or a new flag) is checked too. Each
runs its own ``main()`` with ``--help`` in-process; the parser it built is kept and its help (and
that of each sub-command) is read flag by flag.
"""
import argparse
import importlib
import json
import re
import subprocess
import sys
import time

import pytest
from conftest import ROOT, import_script

SCRIPTS = sorted(p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("[0-9][0-9]_*.py"), *ROOT.glob("bench/*.py")])
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in ROOT.glob("clid/**/*.py")
                 if 'if __name__ == "__main__"' in p.read_text())


def help_of(main, argv0, monkeypatch, capsys) -> argparse.ArgumentParser:
    """Run ``main()`` as ``argv0 --help``; return the parser that printed the help."""
    printed = []
    print_help = argparse.ArgumentParser.print_help

    def keep_parser(parser, file=None):
        printed.append(parser)
        print_help(parser, file)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", keep_parser)
    monkeypatch.setattr(sys, "argv", [argv0, "--help"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code in (0, None), capsys.readouterr().err
    assert "usage:" in capsys.readouterr().out
    return printed[-1]


def parsers(parser):
    """The parser and the parsers of its sub-commands."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


def option_entries(help_text: str) -> dict[str, str]:
    """Each option's entry of a help text, whitespace collapsed, keyed by its option strings."""
    entries, key = {}, None
    for line in help_text.splitlines():
        if re.match(r"  -", line):  # an option's first line: "  -s, --long VALUE   its help"
            invocation = re.split(r"\s{2,}", line.strip())[0]
            key = tuple(part.split(" ")[0] for part in invocation.split(", "))
            entries[key] = line.strip()
        elif key and line.startswith("   "):  # continuation of the entry
            entries[key] += " " + line.strip()
        else:
            key = None
    return {k: " ".join(v.split()) for k, v in entries.items()}


def flags(parser):
    """Every flag of a parser but --help."""
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
            and a.help != argparse.SUPPRESS]


def expected_defaults(parser):
    """(option strings, default as argparse prints it) of every flag that has a default and whose help
    does not state it in its own words, "(default: ...)"."""
    for action in flags(parser):
        if action.default is argparse.SUPPRESS or "(default" in (action.help or ""):
            continue
        if action.default is None or action.default == []:  # nothing unless given: the help says what
            continue
        if action.nargs == 0 and action.default is False:  # a switch, off unless given: no "(default: False)"
            continue
        yield tuple(action.option_strings), f"(default: {action.default})"


DEFAULT_STATED = re.compile(r"(?:\(|; )default:")  # a flag's own default, "(default: X)" or "...; default: X)"


def check_defaults_shown(parser):
    """Every flag explained in words, with its default shown once; returns the defaults checked."""
    checked = 0
    for sub in parsers(parser):
        entries = option_entries(sub.format_help())
        for options, shown in expected_defaults(sub):
            assert options in entries, f"{sub.prog}: {options} has no entry in --help"
            assert shown in entries[options], f"{sub.prog} {options[-1]}: --help says {entries[options]!r}, not {shown}"
            checked += 1
        for action in flags(sub):
            entry = entries[tuple(action.option_strings)]
            words = re.sub(r"\(default: [^)]*\)", "", action.help or "")
            assert re.search(r"[a-z]{2,}", words), f"{sub.prog} {action.option_strings[-1]}: no explanation in --help"
            assert "(default: False)" not in entry, f"{sub.prog} {action.option_strings[-1]}: {entry!r}"
            stated = DEFAULT_STATED.findall(entry)
            assert len(stated) <= 1, f"{sub.prog} {action.option_strings[-1]}: its default twice: {entry!r}"
    return checked


def check_grouped(parser):
    """Every flag of a numbered script (its sub-commands' too) sits in a named group, as 04's and 06's."""
    for sub in parsers(parser):
        default_groups = ("options", "optional arguments", "positional arguments")  # (argparse's own)
        loose = [a.option_strings[-1] for group in sub._action_groups if group.title in default_groups
                 for a in group._group_actions if a in flags(sub)]
        assert not loose, f"{sub.prog}: {loose} in no named group of --help (give each flag a group, as 04 does)"


@pytest.fixture(autouse=True)
def wide_help(monkeypatch):
    """One line per help string (no wrapping), and no SLURM array in the environment."""
    monkeypatch.setenv("COLUMNS", "10000")
    for name in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"):
        monkeypatch.delenv(name, raising=False)


def test_command_lines_are_found():
    assert "02_scenegraph_captions.py" in SCRIPTS and "bench/bench_sampler.py" in SCRIPTS
    assert {"clid.stats", "clid.shard", "clid.emlnet", "clid.captions", "clid.caption.__main__", "clid.app"} <= set(MODULES)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help_shows_defaults(script, monkeypatch, capsys):
    module = import_script(script, "help_" + script.replace("/", "_").removesuffix(".py"))
    parser = help_of(module.main, script, monkeypatch, capsys)
    assert check_defaults_shown(parser) > 0
    if not script.startswith("bench/"):
        check_grouped(parser)


@pytest.mark.parametrize("name", MODULES)
def test_module_help_shows_defaults(name, monkeypatch, capsys):
    parser = help_of(importlib.import_module(name).main, name, monkeypatch, capsys)
    check_defaults_shown(parser)
    if name in ("clid.features", "clid.caption"):  # the commands of a user's own images, grouped as the scripts
        check_grouped(parser)


def test_a_parser_without_the_formatter_fails_the_check():
    """The check is not vacuous: argparse's plain formatter does not show the defaults."""
    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--k", type=int, default=2, help="children per object")
    with pytest.raises(AssertionError, match=r"--k: --help says .*not \(default: 2\)"):
        check_defaults_shown(parser)


def test_the_checks_find_a_default_twice_a_bare_flag_and_a_loose_one():
    """The checks are not vacuous: a default stated by the help and appended by the formatter, a flag
    with nothing but its default, and a flag outside the named groups each fail."""
    from clid.run.cli import HelpFormatter

    twice = argparse.ArgumentParser(prog="demo", formatter_class=HelpFormatter)
    twice.add_argument("--order", default="epochs", help="how captions are drawn; default: shuffled epochs")
    with pytest.raises(AssertionError, match="--order: its default twice"):
        check_defaults_shown(twice)
    bare = argparse.ArgumentParser(prog="demo", formatter_class=HelpFormatter)
    bare.add_argument("--seed", type=int, default=0)
    with pytest.raises(AssertionError, match="--seed: no explanation"):
        check_defaults_shown(bare)
    loose = argparse.ArgumentParser(prog="demo", formatter_class=HelpFormatter)
    loose.add_argument_group("run", "the run").add_argument("--out", help="output folder")
    loose.add_argument("--seed", type=int, default=0, help="random seed")
    with pytest.raises(AssertionError, match=r"\['--seed'\] in no named group"):
        check_grouped(loose)


def test_a_switch_shows_no_default():
    from clid.run.cli import HelpFormatter

    parser = argparse.ArgumentParser(prog="demo", formatter_class=HelpFormatter)
    parser.add_argument("--force", action="store_true", help="replace the output")
    parser.add_argument("--average", action=argparse.BooleanOptionalAction, default=True, help="average")
    entries = option_entries(parser.format_help())
    assert entries[("--force",)] == "--force replace the output"
    assert entries[("--average", "--no-average")].endswith("(default: True)")


def test_the_formatter_shows_lists_and_percent_signs():
    from clid.run.cli import HelpFormatter

    parser = argparse.ArgumentParser(prog="demo", formatter_class=HelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7], help="problem sizes")
    parser.add_argument("--c", type=float, default=2.0, help="%% of the pool dropped per iteration")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: offline bert-base-uncased)")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    assert check_defaults_shown(parser) == 3
    entries = option_entries(parser.format_help())
    assert entries[("--c",)] == "--c C % of the pool dropped per iteration (default: 2.0)"
    assert entries[("--tokenizer",)].endswith("(default: offline bert-base-uncased)")
    assert "None" not in entries[("--tokenizer",)]


# --help and a bad flag answer before the model stack loads: each command parses its flags first
HEAVY = ("torch", "transformers", "clid._C")
STAGES = sorted(p.name for p in ROOT.glob("[0-9][0-9]_*.py"))
HELP_SECONDS = 5.0  # a generous limit on a busy machine; docs/running.md has the times measured at rest
PROBE = """
import json, runpy, sys
target, flag, report = sys.argv[1:]
sys.argv = [target, flag]
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target.removesuffix(".__main__"), run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as stop:
    code = stop.code
with open(report, "w") as f:
    json.dump({"code": code, "loaded": [m for m in %r if m in sys.modules]}, f)
""" % (HEAVY,)


def answer(command: str, flag: str, tmp_path):
    """(exit code, the heavy modules loaded, seconds) of ``command flag`` in a fresh interpreter."""
    report = tmp_path / "report.json"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, command, flag, str(report)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0 and report.exists(), proc.stderr[-3000:]
    found = json.loads(report.read_text())
    return found["code"], found["loaded"], seconds, proc


@pytest.mark.parametrize("command", STAGES + MODULES)
def test_help_answers_without_the_model_stack(command, tmp_path):
    code, loaded, seconds, proc = answer(command, "--help", tmp_path)
    assert code in (0, None) and "usage:" in proc.stdout
    assert loaded == [], f"{command} --help imported {loaded} before answering: parse the flags first"
    assert seconds < HELP_SECONDS, f"{command} --help took {seconds:.1f} s"


@pytest.mark.parametrize("command", STAGES + MODULES)
def test_a_bad_flag_answers_without_the_model_stack(command, tmp_path):
    code, loaded, _, proc = answer(command, "--no-such-flag", tmp_path)
    assert code == 2 and "error:" in proc.stderr, proc.stderr[-2000:]  # (argparse's usage error)
    assert loaded == [], f"{command} --no-such-flag imported {loaded} before answering"


def test_the_probe_sees_torch_imported(tmp_path):
    """The check is not vacuous: a command that imports torch before its flags is caught."""
    script = tmp_path / "eager.py"
    script.write_text("import argparse\nimport torch\nargparse.ArgumentParser().parse_args()\n")
    _, loaded, _, _ = answer(str(script), "--help", tmp_path)
    assert loaded == ["torch"]
