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
cosine's horizon, 06's eta, the output shortlist). ``extends = "NAME"`` starts from another recipe. Any other
table is read by the shell scripts only."""
from __future__ import annotations

import argparse
import functools
import os
import sys
import tomllib
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
PAPER = "paper"  # --recipe paper: no file, every flag's default (LaBERT's recipe, as the paper)
MODELS = ("trusted", "extended", "scoring", "selection")
SELECTION_ITERATIONS = 50  # c = 2% of the pool dropped per iteration: 06's selection ends after 50 iterations
DEMO_STEPS_ENV = "CLID_DEMO_STEPS"  # the steps of --recipe demo (recipes/demo.toml: 1000): fewer for a quick smoke test


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


def _load(name: str, seen: tuple) -> dict:
    path = recipe_path(name)
    if name in seen:
        raise ValueError(f"{path} extends itself (through {' -> '.join(seen)})")
    try:
        with open(path, "rb") as f:
            recipe = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"no recipe {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path} is not TOML: {err}") from None
    base = recipe.pop("extends", None)
    if base is None:
        return recipe
    merged = _load(str(base), (*seen, name))
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Print one setting of a recipe (recipes/NAME.toml), for a shell script.")
    commands = p.add_subparsers(dest="command", required=True)
    get = commands.add_parser("get", help="print one setting, e.g. `get demo resolved.steps`")
    get.add_argument("recipe", help="a recipe's name (recipes/NAME.toml) or a .toml file")
    get.add_argument("key", help="the setting: TABLE.NAME, as train.lr")
    eta = commands.add_parser("eta", help="print 06's eta under the recipe at its own steps ([resolved] steps, eta_span)")
    eta.add_argument("recipe", help="a recipe's name (recipes/NAME.toml) or a .toml file")
    args = p.parse_args(argv)
    if args.command == "eta":
        print(selection_eta(args.recipe, setting(args.recipe, "resolved.steps")))
    else:
        print(shell_word(setting(args.recipe, args.key)))


if __name__ == "__main__":  # (run as a file, without clid: a ValueError of main is the shell's one error line)
    try:
        main()
    except ValueError as err:
        sys.exit(f"error: {err}")
