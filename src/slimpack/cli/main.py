"""Entry point: dispatches to the command modules and turns user errors into one line: exit 1 for a
plan that fails the checker, exit 2 for any other bad input."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from slimpack import __version__
from slimpack.errors import InvalidPlanError, UserError

# name -> module; a module has HELP (one line), add_arguments(parser) and run(args) -> int.
COMMANDS: dict[str, str] = {
    "compare": "slimpack.cli.compare",
    "datasets": "slimpack.cli.datasets",
    "lengths": "slimpack.cli.lengths",
    "cost": "slimpack.cli.cost",
    "plan": "slimpack.cli.plan",
    "validate": "slimpack.cli.validate",
    "simulate": "slimpack.cli.simulate",
    "verify": "slimpack.cli.verify",
    "train": "slimpack.cli.train",
    "calibrate": "slimpack.cli.calibrate",
    "fidelity": "slimpack.cli.fidelity",
    "tune": "slimpack.cli.tune",
}

EXIT_INVALID_PLAN = 1
EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on bad flags already; keep its message to one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="slimpack", description=(
        "Plan, simulate and compare variable-length packing strategies for hybrid-parallel LLM "
        "training (SlimPack and baselines)."))
    parser.add_argument("--version", action="version", version=f"slimpack {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the exact command, for reports that say how to reproduce them
    if args.command is None:
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return int(args.run(args) or 0)
    except InvalidPlanError as exc:
        if args.debug:
            raise
        print(f"slimpack {args.command}: invalid plan: {exc}", file=sys.stderr)
        return EXIT_INVALID_PLAN
    except (UserError, OSError) as exc:
        if args.debug:
            raise
        message = str(exc) if isinstance(exc, UserError) else f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
        print(f"slimpack {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"slimpack {args.command}: interrupted", file=sys.stderr)
        return 130
