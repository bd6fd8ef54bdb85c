"""Runtime tests need torch; without it they are not collected (the rest of the suite still runs)."""

import importlib.util
import os

from hypothesis import settings

if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    import torch

    # Tiny matrices: one thread is fastest and immune to oversubscription under pytest-xdist.
    torch.set_num_threads(1)

settings.register_profile("runtime", deadline=None, max_examples=int(os.environ.get("SLIMPACK_EXAMPLES", "25")),
                          derandomize=False, print_blob=True)
