import pytest
from hypothesis import settings

from helpers import config
from slimpack.cli.main import main
from slimpack.plan import Plan, plan_to_dict
from slimpack.plan.types import Sample
from slimpack.strategies import make_planner

# No per-example deadline anywhere: examples are timed on a shared 2-core machine, where hypothesis'
# default 200 ms deadline fails tests at random (DeadlineExceeded / Flaky) without any bug.
settings.register_profile("slimpack", deadline=None)
settings.load_profile("slimpack")

SMALL_LENGTHS = (3000, 1500, 5000, 800, 2500, 4096, 700, 1200)


def run_cli(argv: list[str]) -> int:
    """Exit code of ``slimpack argv``, whether the command returns or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def small_plan() -> Plan:
    """A real ``fixed`` plan on pp=2 x dp=2 (sample 0 is 3000 tokens, whole, in pipeline 0)."""
    batch = [Sample(id=i, length=n) for i, n in enumerate(SMALL_LENGTHS)]
    return make_planner("fixed", config(pp=2, dp=2, max_context=4096)).plan(batch, step=1)


@pytest.fixture(scope="session")
def small_plan_dict(small_plan) -> dict:
    return plan_to_dict(small_plan)
