"""Rebuild the bundled length arrays (src/slimpack/data/bundled/<name>.npz) from the source CSVs.

    python scripts/bundle_lengths.py [--source DIR] [--out DIR]

Each CSV named in ``slimpack.data.registry.BUNDLED`` is read with slimpack's own loader (so the
same validation applies), stored as the array ``lengths`` in the smallest unsigned integer dtype
that holds its maximum, data order kept, in a deflate-compressed ``.npz``. The zip entries carry a
fixed timestamp so that rerunning the script on the same input gives byte-identical files (git
sees no change). Prints name, rows, dtype, bytes and the SHA-256 of each source file.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import zipfile
from pathlib import Path

import numpy as np

from slimpack.data.loaders import load_lengths
from slimpack.data.registry import BUNDLED

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = Path("/work/shared/data/lengths")
DEFAULT_OUT = ROOT / "src" / "slimpack" / "data" / "bundled"
_EPOCH_1980 = (1980, 1, 1, 0, 0, 0)  # earliest date a zip entry can carry


def write_npz(path: Path, lengths: np.ndarray) -> None:
    """A reproducible ``np.savez_compressed`` (numpy stamps entries with the current time)."""
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, lengths, allow_pickle=False)
    entry = zipfile.ZipInfo("lengths.npy", date_time=_EPOCH_1980)
    entry.compress_type = zipfile.ZIP_DEFLATED
    entry.external_attr = 0o644 << 16
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(entry, buffer.getvalue(), compresslevel=9)


def smallest_dtype(lengths: np.ndarray) -> np.dtype:
    for dtype in (np.uint16, np.uint32):
        if int(lengths.max()) <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="folder of the CSVs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the .npz files")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in BUNDLED.values():
        source = args.source / spec.source_csv
        lengths = load_lengths(source, column=spec.column)
        stored = lengths.astype(smallest_dtype(lengths))
        assert np.array_equal(stored, lengths), f"{spec.name}: dtype narrowing lost values"
        target = args.out / spec.file
        write_npz(target, stored)
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        print(f"{spec.name:10s} {lengths.size:>9,d} rows  {stored.dtype}  "
              f"{target.stat().st_size:>9,d} B  sha256({spec.source_csv})={digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
