"""Everything but ``slimpack.runtime`` imports without torch (DESIGN.md §2), including the CLI."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import pkgutil, importlib
import slimpack
names = [m.name for m in pkgutil.walk_packages(slimpack.__path__, "slimpack.")]
imported = []
for name in names:
    # the runtime, and the Hugging Face batches (torch DataLoader), are the torch side
    if name in ("slimpack.__main__", "slimpack.runtime", "slimpack.integrations.hf") or name.startswith("slimpack.runtime."):
        continue
    importlib.import_module(name)
    imported.append(name)
from slimpack.cli.main import build_parser
build_parser().format_help()
print(" ".join(sorted(imported)))
"""


def test_packages_import_without_torch() -> None:
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    imported = proc.stdout.split()
    for name in ("slimpack.config", "slimpack.cost", "slimpack.plan", "slimpack.cli.main", "slimpack.cli.verify",
                 "slimpack.integrations.megatron"):
        assert name in imported


def test_help_works_without_torch() -> None:
    code = "import sys; sys.modules['torch'] = None\nfrom slimpack.cli.main import main\nsys.exit(main(['--help']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "verify" in proc.stdout
