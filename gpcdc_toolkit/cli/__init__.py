"""The ``gpcdc`` command line."""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..cluster import masked
from ..config import load_config
from ..errors import GpcdcError
from ._command import Command, add_config_flags
from ._commands import COMMANDS, GROUPS


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, saying where the help is (its subcommands' parsers are
    of this class too)."""

    def error(self, message: str) -> NoReturn:
        # A flag it does not know is quoted back with its value: a DSN's password too.
        self.exit(2, f"gpcdc: error: {masked(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpcdc", description="Change data capture for Greenplum-style clusters.")
    add_config_flags(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group, (help_text, members) in GROUPS.items():
        sub = commands.add_parser(group, help=help_text).add_subparsers(dest="action", required=True, metavar="ACTION")
        for command in members:
            _add(sub, command)
    for command in COMMANDS:
        _add(commands, command)
    return parser


def _add(subparsers: argparse._SubParsersAction, command: Command) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(command.name, help=command.help, description=command.help)
    command.add_arguments(parser)
    if command.sections:
        add_config_flags(parser.add_argument_group("settings"), command.sections)
    parser.set_defaults(handler=command)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="gpcdc: %(levelname)s: %(message)s")
    args = build_parser().parse_args(argv)
    flags = {k.split(":", 1)[1]: v for k, v in vars(args).items() if k.startswith("setting:")}
    try:
        config = load_config(flags, config_file=args.config)
        return int(args.handler.run(args, config))
    except GpcdcError as e:
        print(f"gpcdc: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("gpcdc: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a client library's error that no layer put words to: one line still
        if os.environ.get("GPCDC_DEBUG"):
            raise
        print(f"gpcdc: error: {_describe(e)} (GPCDC_DEBUG=1 shows where)", file=sys.stderr)
        return 2 if _refused_kafka_setting(e) else 1


def run() -> NoReturn:
    """The ``gpcdc`` program: :func:`main` on the command line's arguments, then exit
    with its status."""
    status = main()
    # What the command opened is closed by now. Left to itself, the interpreter's last
    # collection would walk every object still alive before the process ends: some
    # 0.9 s once great-expectations is imported (300 MB of them), longer than many a
    # command. Frozen, they are left to the process's end: exit handlers still run,
    # and objects in reference cycles are not finalized (Python does not promise it).
    gc.freeze()
    sys.exit(status)


def _describe(error: Exception) -> str:
    from confluent_kafka import KafkaException
    from psycopg import Error as PostgresError
    from psycopg.errors import InsufficientPrivilege

    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if isinstance(error, OSError) and error.filename is not None:
        fix = {errno.ENOSPC: "free space there, or point --work-dir elsewhere",
               errno.EDQUOT: "free space there, or point --work-dir elsewhere",
               errno.EACCES: "make it writable for this user, or point --work-dir elsewhere",
               errno.EPERM: "clear its immutable or append-only attribute (lsattr shows them), or point --work-dir elsewhere",
               errno.EROFS: "point --work-dir at a writable filesystem"}.get(error.errno or 0, "check the path")
        return f"cannot use {error.filename}: {error.strerror}: {fix}"
    if isinstance(error, KafkaException):
        said = f"Kafka: {error.args[0].str() if error.args and hasattr(error.args[0], 'str') else first}"
        return f"{said}: correct [kafka.client] in the config file" if _refused_kafka_setting(error) else said
    if isinstance(error, InsufficientPrivilege):
        return f"PostgreSQL: {first}: grant it to the DSN's user, or connect as one who has it"
    if isinstance(error, PostgresError):
        return f"PostgreSQL: {first}"
    return f"unexpected {type(error).__name__}: {first}"


def _refused_kafka_setting(error: Exception) -> bool:
    """librdkafka refused a client's configuration: one of [kafka.client]'s settings
    (the toolkit's own are checked when the configuration is read)."""
    from confluent_kafka import KafkaError, KafkaException

    reason = error.args[0] if isinstance(error, KafkaException) and error.args else None
    return isinstance(reason, KafkaError) and reason.code() == KafkaError._INVALID_ARG


if __name__ == "__main__":
    run()
