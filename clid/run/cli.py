"""The command-line helpers: the help formatter, the numeric flag types and :func:`run_main`.

The numbered scripts, the bench scripts and the ``python -m clid.X`` tools build their parsers with
``formatter_class=HelpFormatter``. It keeps the description's line breaks and appends
"(default: VALUE)" to every flag's help, also to a flag written without help text. It leaves the
help as written when the default is None or an empty list (nothing is used unless the flag is
given; the help says what happens then), or when the help already states its default.

It also holds the ``type=`` functions that check every numeric flag where it is parsed
(:func:`number` and the common cases built from it: ``positive_int``, ``probability``, ...), and
:func:`run_main`, which runs a command's ``main()`` offline (:func:`stay_offline`; bad input ends in
one line ``error: ...``).
"""
import argparse
import copy
import errno
import math
import os
import sys

from clid.base.files import DataError, Stopped


def shows_default(action: argparse.Action) -> bool:
    """Whether --help shows the flag's default: not for none, nor for a switch that is off unless given."""
    switch_off = action.nargs == 0 and action.default is False
    return action.default is not argparse.SUPPRESS and action.default is not None and action.default != [] and not switch_off


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, silent where a default would read as "None" or "[]"."""

    def _get_help_string(self, action):
        help_text = action.help or ""
        if not shows_default(action) or "(default" in help_text:
            return help_text
        return super()._get_help_string(action)

    def _format_action(self, action):
        # argparse prints no help column for a flag without help text: give it one for the default
        if not action.help and action.option_strings and shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)


class WrappedHelpFormatter(HelpFormatter):
    """:class:`HelpFormatter` that wraps the description, for one written as a single long line."""

    _fill_text = argparse.HelpFormatter._fill_text


# ---------------------------------------------------------------------------------------------
# Numbers checked where they are parsed: ``type=`` functions whose error is argparse's one line,
# "argument --lr: must be a positive finite number, got 'nan'".


def is_whole_number(text) -> bool:
    """Whether ``text`` is a whole number written as people type it: digits 0-9 only, after an optional sign.
    (``str.isdigit`` also passes "10²", which ``int`` refuses; ``int`` also reads "١٢" and "１２".)"""
    text = str(text).strip()
    body = text[1:] if text[:1] in ("+", "-") else text
    return bool(body) and body.isascii() and body.isdigit()


def whole_number(text) -> int:
    """A number typed by a person (a level, an id, a shard index, a count) as an int; a ValueError that says
    it must be written in the digits 0-9 otherwise (:func:`is_whole_number`)."""
    if not is_whole_number(text):
        raise ValueError(f"must be a whole number written in the digits 0-9, got {str(text)!r}")
    return int(text)


def level_numbers(values) -> list[int]:
    """Level numbers from 1 as typed: "1 3 6", "1,3,6", "L3" (a leading L, as the reports name levels); a
    ValueError names the value that is not one."""
    out = []
    for value in values:
        for part in str(value).replace(",", " ").split():
            number = part[1:] if part[:1] in ("L", "l") else part
            if not is_whole_number(number) or int(number) < 1:
                raise ValueError(f"takes level numbers from 1 written in the digits 0-9 (1 3 6, 1,3,6 or L3), got {part!r}")
            out.append(int(number))
    if not out:
        raise ValueError("takes level numbers from 1 (1 3 6, 1,3,6 or L3), got none")
    return out


def number(kind=float, low=None, high=None, low_open=False, high_open=False, what: str | None = None):
    """An argparse ``type=`` for a finite ``kind`` (int or float) within [low, high] (a bound open with
    ``low_open`` / ``high_open``; None: unbounded). ``what`` words the error ("a positive integer")."""
    if what is None:
        noun = "an integer" if kind is int else "a finite number"
        if low is not None and high is not None:
            what = f"{noun} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            what = f"{noun} {'>' if low_open else '>='} {low:g}"
        elif high is not None:
            what = f"{noun} {'<' if high_open else '<='} {high:g}"
        else:
            what = noun

    def parse(text):
        try:
            value = whole_number(text) if kind is int else kind(text)
        except (TypeError, ValueError):
            digits = " in the digits 0-9" if kind is int else ""
            raise argparse.ArgumentTypeError(f"must be {what}{digits}, got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        if low is not None and (value < low or (low_open and value == low)):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        if high is not None and (value > high or (high_open and value == high)):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = what  # (argparse names a type by it in some messages)
    parse.number_kind = kind  # (a recipe's value for this flag must be a number: clid.training.flags.recipe_value)
    return parse


positive_int = number(int, low=1, what="a positive integer")
non_negative_int = number(int, low=0, what="an integer >= 0")
finite_float = number(float, what="a finite number")
positive_float = number(float, low=0, low_open=True, what="a positive finite number")
non_negative_float = number(float, low=0, what="a finite number >= 0")
probability = number(float, low=0, high=1, high_open=True, what="a probability in [0, 1)")
unit_interval = number(float, low=0, high=1, what="a number in [0, 1]")


# ---------------------------------------------------------------------------------------------
# Flags that several commands share

def add_levels_arg(parser, help: str, default: str | None = "caption") -> None:
    """``--levels``: a level set by name (clid.base.text.LEVEL_SETS: caption, paragraph, labert)."""
    from clid.base.text import LEVEL_SETS

    parser.add_argument("--levels", default=default, choices=list(LEVEL_SETS), help=help)


def add_tokenizer_arg(parser, what: str = "tokenizer folder") -> None:
    """``--tokenizer``: the tokenizer that counts caption lengths (clid.base.text.load_tokenizer)."""
    parser.add_argument("--tokenizer", default=None, help=f"{what} (default: offline bert-base-uncased)")


# ---------------------------------------------------------------------------------------------
# Running a command: offline, and bad input is one line, not a traceback

ALLOW_DOWNLOAD = "--allow-download"
ALLOW_DOWNLOAD_ENV = "CLID_ALLOW_DOWNLOAD"  # =1: every command may download, as with --allow-download


def add_download_arg(parser) -> None:
    """``--allow-download``, for a command that loads a model by a name a hub could resolve."""
    parser.add_argument(ALLOW_DOWNLOAD, action="store_true",
                        help="let this run download a model named by a hub name from the Hugging Face hub (default: "
                             f"offline, so a model that is not on disk is one error line at once; {ALLOW_DOWNLOAD_ENV}=1 "
                             "allows it for every command)")


def stay_offline(argv) -> bool:
    """Put the model hubs in offline mode (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``) unless the user
    allowed downloads: ``--allow-download`` in ``argv``, or ``CLID_ALLOW_DOWNLOAD=1``. A value the user set
    for either variable is kept. Returns whether this run is offline.

    Runs before the command imports a hub library, which reads the variables once, at import. The flag is
    seen as argparse reads it: also abbreviated ("--allow-d"), as argparse accepts it."""
    if allows_download(argv) or os.environ.get(ALLOW_DOWNLOAD_ENV) == "1":
        if os.environ.get("HF_HUB_OFFLINE") == "1" or (problem := hub_problem()) is None:
            return False
        print(f"warning: downloads are allowed, but {problem}: going on offline (a model on disk still loads; "
              "one that is not is one error line)", file=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return True


HUB_TIMEOUT = 10  # seconds the hub has to answer before a run with downloads allowed goes on offline


def hub_problem() -> str | None:
    """Why the hub (``HF_ENDPOINT``) cannot serve a download, or None: it does not answer within
    :data:`HUB_TIMEOUT` seconds, or cannot be reached. Any HTTP answer, even an error status, is an answer: the hub
    library then asks for the files themselves (and would wait, and retry, for minutes on a hub that never answers)."""
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=HUB_TIMEOUT):
            return None
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return f"the hub {endpoint} did not answer within {HUB_TIMEOUT} s"
        return f"the hub {endpoint} cannot be reached ({reason})"


def allows_download(argv) -> bool:
    """Whether ``argv`` gives ``--allow-download``, whole or abbreviated to at least "--al" (before any "--")."""
    for arg in map(str, argv):
        if arg == "--":
            return False
        if len(arg) >= 4 and ALLOW_DOWNLOAD.startswith(arg):
            return True
    return False


def empty_value(argv) -> str | None:
    """The flag given an empty value (``--gallery ""``, ``--tables=``), in words, or None. No path, name or number
    is ever empty: argparse would take it as a flag not given (no gallery written, without a word) or as the path ''."""
    flag = None
    for token in argv:
        if token.startswith("-") and token not in ("-", "--"):
            flag, _, value = token.partition("=")
            if "=" in token and not value.strip():
                return f"argument {flag}: an empty value"
        elif not token.strip():
            return f"argument {flag}: an empty value" if flag else "an empty argument"
    return None


def run_main(main, argv=None):
    """Run a command's ``main(argv)`` offline (:func:`stay_offline`); bad input ends in one line
    ``error: ...`` and exit status 1.

    A :class:`DataError` names the file, the record and the problem; an ``OSError`` (a missing
    file, a folder where a file belongs) names the path. Under ``torchrun`` every rank reads the same
    files, so only rank 0 prints the line (:func:`error_exit`). A :class:`~clid.base.files.Stopped` run
    exits with its status (SIGTERM: 128 + the signal).
    """
    given = sys.argv[1:] if argv is None else [str(a) for a in argv]
    if problem := empty_value(given):
        error_exit(f"error: {problem}: give a value, or leave the flag out")
    stay_offline(given)
    try:
        return main(argv)
    except OSError as err:
        if err.errno == errno.ENOSPC:  # (atomic writes leave no half-written file behind)
            where = f" writing {err.filename}" if err.filename else ""
            error_exit(f"error: no space left on the device{where}; no output was left half-written: free some "
                       "space and run the same command again (a sharded stage resumes)")
        error_exit(f"error: {err}")
    except DataError as err:
        error_exit(f"error: {err}")
    except Stopped as stop:
        sys.exit(stop.code)
    except SystemExit as stop:
        if isinstance(stop.code, str):  # an "error: ..." line of the command itself
            error_exit(stop.code)
        raise


def torchrun_rank() -> int | None:
    """This process's rank when ``torchrun`` started it (it sets TORCHELASTIC_RUN_ID), else None."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    return int(os.environ.get("RANK", "0"))


def error_exit(line: str) -> None:
    """Exit with status 1 after printing ``line`` to stderr; under torchrun only rank 0 prints it (the
    other ranks meet the same error in the same files), so a job shows it once. Control characters and bytes of a
    file name that are not UTF-8 are escaped (``\\n``, ``\\x01``, ``\\udcff``): the line stays one line, and printable."""
    if torchrun_rank() in (None, 0):
        line = "".join(c if c.isprintable() or c == "\t" else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                       for c in str(line).rstrip("\n"))
        print(line, file=sys.stderr, flush=True)
    sys.exit(1)
