"""What every ``gpcdc`` command shares: the base class, output, the configuration flags."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import SETTINGS, Config, Setting


class Command:
    """A subcommand: ``name`` and ``help`` for the parser, ``add_arguments``, ``run``.

    ``sections`` names the configuration sections the command reads; their settings'
    flags are accepted after the command's name as well as before it."""

    name = ""
    help = ""
    sections: tuple[str, ...] = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace, config: Config) -> int:
        raise NotImplementedError


def say(line: str) -> None:
    print(line, flush=True)


def add_config_flags(parser: argparse._ActionsContainer, sections: tuple[str, ...] | None = None) -> None:
    """The flags of every setting (``sections`` None), or of the named sections' settings.

    A subcommand's copies default to nothing at all, so that they do not overwrite what
    was given before the command's name."""
    if sections is None:
        parser.add_argument("--config", type=Path, help="configuration file (default: $GPCDC_CONFIG or ./gpcdc.toml)")
    for spec in SETTINGS.values():
        if sections is None or spec.section in sections:
            _add_flag(parser, spec, default=None if sections is None else argparse.SUPPRESS)


def _add_flag(parser: argparse._ActionsContainer, spec: Setting, default: object) -> None:
    help_text = f"{spec.help} (default: {spec.default}; {spec.env_var})"
    dest = "setting:" + spec.name
    if spec.type is bool:
        parser.add_argument(spec.flag, dest=dest, action=argparse.BooleanOptionalAction, default=default,
                            help=help_text)
    else:
        parser.add_argument(spec.flag, dest=dest, metavar=spec.type.__name__.upper(), default=default,
                            choices=spec.choices or None, help=help_text)
