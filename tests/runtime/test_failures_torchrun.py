"""Under torchrun, a rank that hangs inside the loss all-reduce or inside a send ends the job with one
line from the waiting rank naming itself, the action and the hung rank, after the ``--timeout``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

TIMEOUT_S = 3


@pytest.mark.parametrize(("point", "action"), [("loss all-reduce", "step 0: the loss all-reduce"),
                                               ("send", "step 0: receiving B0 from rank 1")])
def test_a_hung_rank_is_named_within_the_timeout(point, action):
    # rank 1 (the last stage) sleeps at the point, as a stopped rank would, for longer than the
    # subprocess may run: the job can only end in time if rank 0 ends it
    env = {**os.environ, "SLIMPACK_FAULT": f"1:{point}:120", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "slimpack", "train", "--steps", "1", "--max-context", "256",
                           "--global-batch-tokens", "1024", "--dtype", "float64", "--pp", "2",
                           "--timeout", str(TIMEOUT_S)],
                          capture_output=True, text=True, timeout=100, env=env, check=False)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("slimpack: ")]
    assert ours == [f"slimpack: rank 0: {action} did not finish within {TIMEOUT_S} s (--timeout); rank 1 has died "
                    f"or hangs. Aborting the job."], proc.stderr[-3000:]
    assert re.search(r"rank\s*: 0 .*\n\s*exitcode\s*: 3", proc.stderr)  # torchrun's summary: rank 0 ended it
