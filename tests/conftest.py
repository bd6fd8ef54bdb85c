import pytest

from slimpack.cli.main import main


def run_cli(argv: list[str]) -> int:
    """Exit code of ``slimpack argv``, whether the command returns or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture
def cli():
    return run_cli
