"""What every ``gpcdc`` command shares: the base class, output, the configuration flags."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import SETTINGS, Config, flag


class Command:
    """A subcommand: ``name`` and ``help`` for the parser, ``add_arguments``, ``run``."""

    name = ""
    help = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace, config: Config) -> int:
        raise NotImplementedError


def say(line: str) -> None:
    print(line, flush=True)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="configuration file (default: $GPCDC_CONFIG or ./gpcdc.toml)")
    for name, (_default, help_text) in SETTINGS.items():
        parser.add_argument(flag(name), dest="setting:" + name, metavar="VALUE", help=help_text)
