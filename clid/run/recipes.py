"""The recipes: named sets of settings, one TOML file each in the repository's ``recipes/`` folder (demo, coco,
paragraph). 04 and 06 take one with ``--recipe NAME`` (or ``--recipe FILE.toml``); flags given still win. demo.sh
and slurm/ read the same files from bash, one setting at a time:

    python clid/run/recipes.py get demo resolved.steps      # prints 1000
    python clid/run/recipes.py eta demo                     # 06's eta at those steps: 18

run as a file, not with ``-m``: ``import clid`` loads torch, seconds for one number. So this module imports
nothing of clid at its top.

A recipe's tables: ``[train]``, flags of 04 and 06 (their argparse names) that become those stages' defaults;
``[trusted]``, ``[extended]``, ``[scoring]``, ``[selection]``, flags of one model only (04 --data trusted, 04
--data extended, 04 --continue-from, 06); ``[resolved]``, what 04 and 06 work out for each run (the steps, the
cosine's horizon, 06's eta, the output shortlist). ``extends = "NAME"`` starts from another recipe (a .toml file: named
from the folder of the recipe that extends it). The tables of
:data:`SHELL_TABLES` are read by the shell scripts only.

A recipe is checked as flags are: a value of a flag table goes through that flag's own parser (04 and 06 check them
when they read the recipe: clid.training.flags; ``check`` below does it for the shell scripts, before they run
anything); every other setting is checked here, as it loads. An unknown table or key, or a value of the wrong kind,
is one line naming the file, the table and the key."""
from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import sys
import tomllib
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
PAPER = "paper"  # --recipe paper: no file, every flag's default (LaBERT's recipe, as the paper)
MODELS = ("trusted", "extended", "scoring", "selection")
SELECTION_ITERATIONS = 50  # c = 2% of the pool dropped per iteration: 06's selection ends after 50 iterations
DEMO_STEPS_ENV = "CLID_DEMO_STEPS"  # the steps of --recipe demo (recipes/demo.toml: 1000): fewer for a quick smoke test


FLAG_TABLES = ("train", *MODELS)
POSITIVE = "a positive integer"
SHARE = "a number in (0, 1]"
SWITCH = "true or false"
SHELL_TABLES = {  # the settings that are no flag of 04 or 06: table -> key -> what it must be (a tuple: its words)
    "resolved": {"steps": POSITIVE, "extended_horizon": POSITIVE, "eta_span": SHARE, "shortlist": SWITCH},
    "world": {"n_train": POSITIVE, "per_image": POSITIVE},  # demo.sh: 00's --n-train, 02's --per-image
    "quick": {"steps": POSITIVE, "lr_horizon": POSITIVE, "paraphraser": ("rules", "sentences")},
    "small": {"steps": POSITIVE, "eta": POSITIVE, "scoring_steps": POSITIVE},
    "demo": {"scoring_steps": POSITIVE, "decode_steps": POSITIVE},
}


def shown(value) -> str:
    """A setting's value as TOML writes it (text in quotes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, list, dict)):
        return json.dumps(value)
    return str(value)


def setting_problem(value, kind) -> str | None:
    """Why ``value`` is not ``kind`` (:data:`SHELL_TABLES`), or None."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == POSITIVE:
        ok = number and isinstance(value, int) and value >= 1
    elif kind == SHARE:
        ok = number and math.isfinite(value) and 0 < value <= 1
    elif kind == SWITCH:
        ok = isinstance(value, bool)
    else:
        ok = isinstance(value, str) and value in kind
        kind = "one of " + ", ".join(kind)
    return None if ok else f"must be {kind}, got {shown(value)}"


def check_tables(path: Path, recipe: dict) -> None:
    """Refuse (ValueError) a recipe file whose tables or settings are unknown, or whose settings outside the flag
    tables are of the wrong kind; the flag tables' values are checked by the flags' parsers."""
    for table, settings in recipe.items():
        if table == "extends":
            if not isinstance(settings, str) or not settings:
                raise ValueError(f"{path}: extends = {shown(settings)}: must be a recipe's name or a .toml file")
            continue
        if table not in FLAG_TABLES and table not in SHELL_TABLES:
            raise ValueError(f"{path}: [{table}] is no table of a recipe (known: "
                             f"{', '.join([*FLAG_TABLES, *SHELL_TABLES])})")
        if not isinstance(settings, dict):
            raise ValueError(f"{path}: {table} = {shown(settings)}: must be a table, [{table}], not a value")
        for key, value in settings.items():
            where = f"{path}: [{table}] {key}"
            if isinstance(value, dict):
                raise ValueError(f"{where}: must be a value, not a table")
            if table in SHELL_TABLES:
                if key not in SHELL_TABLES[table]:
                    raise ValueError(f"{where}: no such setting (known in [{table}]: "
                                     f"{', '.join(SHELL_TABLES[table])})")
                if problem := setting_problem(value, SHELL_TABLES[table][key]):
                    raise ValueError(f"{where} {problem}")


def flag_settings(name: str, model: str) -> list[tuple[str, str, str, object]]:
    """(file, table, key, value) of every flag the recipe ``name`` sets for ``model``: its ``[train]`` table, then
    the model's own (a key in both: the model's), each named by the file that sets it."""
    if name == PAPER:
        return []
    found = {}
    for table in ("train", model):
        for path, settings in _tables(name, table, ()):
            for key, value in settings.items():
                found[key] = (str(path), table, key, value)
    return list(found.values())


def _tables(name: str, table: str, seen: tuple) -> list[tuple[Path, dict]]:
    """``table`` of the recipe and of those it extends, the base first: (file, settings)."""
    path = recipe_path(name)
    raw = _read(path)
    base = raw.get("extends")
    out = _tables(base_name(path, base), table, (*seen, name)) if isinstance(base, str) and not seen_before(name, seen) else []
    return out + ([(path, raw[table])] if isinstance(raw.get(table), dict) else [])


def base_name(path: Path, base: str) -> str:
    """The recipe that ``extends = "BASE"`` in the file ``path`` names: a recipe's name, or a .toml file, relative to
    ``path``'s folder."""
    return str(path.parent / base) if base.endswith(".toml") else base


def seen_before(name: str, seen: tuple) -> bool:
    """Whether the recipe ``name`` is one of ``seen``, however each is spelled (a file by two paths)."""
    return any(other == name or recipe_path(other).resolve() == recipe_path(name).resolve() for other in seen)


def recipe_names() -> list[str]:
    """The recipes of the ``recipes/`` folder, by name."""
    return sorted(path.stem for path in RECIPES.glob("*.toml"))


def recipe_path(name: str) -> Path:
    """``recipes/NAME.toml``, or ``name`` itself when it names a ``.toml`` file."""
    return Path(name) if name.endswith(".toml") else RECIPES / f"{name}.toml"


@functools.lru_cache(maxsize=None)
def load_recipe(name: str) -> dict:
    """A recipe's tables, those of the recipe it ``extends`` under its own. Raises ValueError saying what is
    wrong (no such file, not TOML, a loop of ``extends``)."""
    return _load(name, ())


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> dict:
    """One recipe file's own tables, checked (:func:`check_tables`)."""
    try:
        with open(path, "rb") as f:
            recipe = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"no recipe {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a folder, not a recipe file") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path} is not TOML: {err}") from None
    check_tables(path, recipe)
    return recipe


def _load(name: str, seen: tuple) -> dict:
    path = recipe_path(name)
    if seen_before(name, seen):
        raise ValueError(f"{path} extends itself (through {' -> '.join(seen)})")
    recipe = copy.deepcopy(_read(path))
    base = recipe.pop("extends", None)
    if base is None:
        return recipe
    merged = _load(base_name(path, str(base)), (*seen, name))
    for key, value in recipe.items():
        merged[key] = {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def recipe_arg(text: str) -> str:
    """argparse type of ``--recipe``: paper, a recipe's name, or a .toml file that reads."""
    if text == PAPER:
        return text
    if not text.endswith(".toml") and text not in recipe_names():
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join([PAPER, *recipe_names()])}, "
                                         "or a .toml file)")
    try:
        load_recipe(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def flag_defaults(name: str, model: str) -> dict:
    """The flags a recipe sets for ``model`` (one of :data:`MODELS`): its ``[train]`` table and the model's own.
    A recipe that resolves the steps (``[resolved] steps``) leaves --max-steps and --lr-horizon to
    :func:`resolved_steps`, whatever the stage's own default."""
    if name == PAPER:
        return {}
    recipe = load_recipe(name)
    flags = {**recipe.get("train", {}), **recipe.get(model, {})}
    if "steps" in resolved(name):
        flags = {"max_steps": None, "lr_horizon": None, **flags}
    return flags


def resolved(name: str) -> dict:
    """A recipe's ``[resolved]`` table (none for paper)."""
    return {} if name == PAPER else load_recipe(name).get("resolved", {})


def resolved_steps(name: str) -> int:
    """The optimizer steps of a recipe that resolves them: ``CLID_DEMO_STEPS``, else its ``[resolved] steps``."""
    from clid.base.files import DataError
    from clid.run.cli import positive_int

    text = os.environ.get(DEMO_STEPS_ENV, str(resolved(name)["steps"]))
    try:
        return positive_int(text)
    except Exception:
        raise DataError(None, None, f"{DEMO_STEPS_ENV} must be a positive integer (the steps of --recipe {name}), "
                                    f"got {text!r}") from None


def selection_eta(name: str, max_steps: int) -> int | None:
    """06's eta under a recipe with ``[resolved] eta_span``: the selection iterations end at that share of the
    steps; None without one."""
    span = resolved(name).get("eta_span")
    return None if span is None else max(1, round(span * max_steps / SELECTION_ITERATIONS))


def setting(name: str, key: str):
    """One setting of a recipe, by its dotted name (``resolved.steps``, ``train.lr``)."""
    value = load_recipe(name)
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"{recipe_path(name)} has no setting {key}")
        value = value[part]
    if isinstance(value, dict):
        raise ValueError(f"{recipe_path(name)}: {key} is a table, not a setting")
    return value


def shell_word(value) -> str:
    """A setting as a shell reads it: true/false as 1 and nothing, numbers and text as they are."""
    if isinstance(value, bool):
        return "1" if value else ""
    return str(value)


def recipe_flag_values(p, name: str, model: str) -> dict:
    """The flags the recipe ``name`` sets for ``model`` (its [train] table and the model's own), each parsed and
    checked by that flag's own ``type=`` and choices, as if it had been typed: a ValueError naming the file, the
    table and the key for a key that is no flag of the stage, or a value the flag refuses."""
    actions = {action.dest: action for action in p._actions if action.option_strings}
    values = {}
    for path, table, key, value in flag_settings(name, model):
        where = f"{path}: [{table}] {key} = {shown(value)}"
        if key not in actions:
            near = key.strip().lower().lstrip("-").replace("-", "_")  # (--max-steps, max-steps, Max_Steps)
            hint = f" (the flag {actions[near].option_strings[0]} is written {near} here)" if near in actions else ""
            raise ValueError(f"{path}: [{table}] {key} is not a flag of this stage{hint}")
        try:
            values[key] = recipe_value(actions[key], value)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as err:
            raise ValueError(f"{where}: {err} (as {actions[key].option_strings[0]})") from None
    return values


def recipe_value(action, value):
    """A recipe's ``value`` for the flag of ``action`` as argparse would make it from the command line: a switch
    takes true or false, a number flag a number (not text), a word flag text; then the flag's own parser and
    choices check it."""
    if action.nargs == 0:  # a switch, store_true
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false ({action.option_strings[0]} is a switch)")
        return value if action.const is True else not value
    many = action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 1)
    if isinstance(value, list):
        if not many:
            raise ValueError("must be one value, not a list")
        if not value and action.nargs == "+":
            raise ValueError("must name at least one value")
        return [one_value(action, v) for v in value]
    return [one_value(action, value)] if many else one_value(action, value)


def one_value(action, value):
    """One value of a recipe for the flag of ``action``, checked and parsed as argparse would parse its text."""
    if isinstance(value, (bool, list, dict)):
        raise ValueError(f"must be {'a number' if is_number_flag(action) else 'text'}, not {shown(value)}")
    if is_number_flag(action) and not isinstance(value, (int, float)):
        raise ValueError(f"must be a number, not the text {shown(value)}")
    parse = action.type  # (argparse's type=: None or str for text)
    text = parse is None or parse is str
    if text and not isinstance(value, str):
        raise ValueError(f"must be text, not the number {shown(value)}")
    parsed = value if text else parse(str(value))
    if action.choices is not None and parsed not in action.choices:
        raise ValueError(f"must be one of {', '.join(map(str, action.choices))}")
    return parsed


def is_number_flag(action) -> bool:
    """Whether the flag takes a number (its type is one of clid.run.cli's number parsers)."""
    return getattr(action.type, "number_kind", None) is not None


STAGES = (("04_train_base.py", ("trusted", "extended", "scoring")), ("06_train_selection.py", ("selection",)))


def check_recipe(name: str) -> None:
    """Check every setting of a recipe as the stages will (a ValueError naming the file, the table and the key):
    its tables as it loads, and its flag tables through 04's and 06's own parsers, so that a shell script stops
    before it runs anything, not when a training job starts hours later. (Loads torch: seconds.)"""
    import importlib.util

    if name == PAPER:
        return
    load_recipe(name)
    if str(RECIPES.parent) not in sys.path:  # (run as a file: the repository's clid)
        sys.path.insert(0, str(RECIPES.parent))
    for script, models in STAGES:
        spec = importlib.util.spec_from_file_location(f"recipe_check_{Path(script).stem}", RECIPES.parent / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for model in models:
            try:
                recipe_flag_values(module.parser(), name, model)
            except ValueError as err:
                raise ValueError(f"{err} ({script} --recipe {name})") from None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Print one setting of a recipe (recipes/NAME.toml), for a shell script.")
    commands = p.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="check every setting of a recipe as 04 and 06 will (before a script "
                                              "runs anything; loads torch, seconds)")
    check.add_argument("recipe", help="a recipe's name (recipes/NAME.toml) or a .toml file")
    get = commands.add_parser("get", help="print one setting, e.g. `get demo resolved.steps`")
    get.add_argument("recipe", help="a recipe's name (recipes/NAME.toml) or a .toml file")
    get.add_argument("key", help="the setting: TABLE.NAME, as train.lr")
    eta = commands.add_parser("eta", help="print 06's eta under the recipe at its own steps ([resolved] steps, eta_span)")
    eta.add_argument("recipe", help="a recipe's name (recipes/NAME.toml) or a .toml file")
    args = p.parse_args(argv)
    if args.command == "check":
        check_recipe(args.recipe)
    elif args.command == "eta":
        print(selection_eta(args.recipe, setting(args.recipe, "resolved.steps")))
    else:
        print(shell_word(setting(args.recipe, args.key)))


if __name__ == "__main__":  # (run as a file, without clid: a ValueError of main is the shell's one error line)
    try:
        main()
    except ValueError as err:
        sys.exit(f"error: {err}")
