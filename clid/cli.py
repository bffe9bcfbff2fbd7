"""The help formatter of every command line: ``--help`` shows each flag's default.

The numbered scripts, the bench scripts and the ``python -m clid.X`` tools build their parsers with
``formatter_class=HelpFormatter``. It keeps the description's line breaks and appends
"(default: VALUE)" to every flag's help, also to a flag written without help text. It leaves the
help as written when the default is None or an empty list (nothing is used unless the flag is
given; the help says what happens then), or when the help already states its default.
"""
import argparse
import copy


def shows_default(action: argparse.Action) -> bool:
    return action.default is not argparse.SUPPRESS and action.default is not None and action.default != []


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
