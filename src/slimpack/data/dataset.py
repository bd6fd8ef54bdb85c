"""A ``Dataset`` is a named, immutable array of document lengths with its provenance and stats.

:func:`load_dataset` resolves what a user types, in this order:

1. a bundled short name (:func:`bundled_datasets`), read from the package (works offline, no
   shared folder needed); to read a local file that happens to carry such a name, write ``./name``;
2. ``synthetic`` or ``synthetic:key=value,...`` (see :mod:`slimpack.data.synthetic`);
3. a path to a length file in any format of :mod:`slimpack.data.loaders`.

Anything else is a ``UserError`` that lists the bundled names.

Must not import torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from slimpack.data.loaders import load_lengths
from slimpack.data.registry import BUNDLED
from slimpack.data.stats import DatasetStats, context_cut, dataset_stats
from slimpack.data.synthetic import SYNTHETIC_NAME, parse_synthetic, synthetic_lengths
from slimpack.errors import UserError


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Dataset:
    name: str
    """Short name (bundled), the synthetic spec, or the path as given."""
    lengths: np.ndarray
    """Tokens per document, int64, in data order; read-only (stored as given if already so)."""
    source: str
    """One provenance line."""
    stats: DatasetStats = field(init=False)
    """Summary statistics, computed once at construction."""

    def __post_init__(self) -> None:
        lengths = np.asarray(self.lengths)
        if lengths.ndim != 1 or lengths.size == 0:
            raise UserError(f"dataset {self.name!r}: expected a non-empty 1-D array of lengths, "
                            f"got shape {lengths.shape}")
        if lengths.dtype.kind not in "iu":
            raise UserError(f"dataset {self.name!r}: lengths must be integers, got {lengths.dtype}")
        if lengths.min() < 1:
            index = int(np.argmin(lengths))
            raise UserError(f"dataset {self.name!r} index {index}: length {lengths[index]} must be >= 1")
        # Copy unless already a read-only int64 array owning its memory, so a caller cannot change
        # the lengths behind the stats' back through a writeable view.
        if lengths.dtype != np.int64 or lengths.flags.writeable or lengths.base is not None:
            lengths = lengths.astype(np.int64, copy=True)
        lengths.flags.writeable = False
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "stats", dataset_stats(lengths))

    def __len__(self) -> int:
        return int(self.lengths.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dataset):
            return NotImplemented
        return (self.name, self.source) == (other.name, other.source) and bool(
            np.array_equal(self.lengths, other.lengths))

    def __hash__(self) -> int:
        return hash((self.name, self.source, self.stats))

    def summary(self, max_context: int | None = None) -> dict[str, Any]:
        """Stable JSON-ready record: name, the stats fields, (with ``max_context``) how many documents
        are longer than it, source (the ``--json`` output)."""
        cut = {} if max_context is None else {
            "max_context": max_context, "docs_over_context": context_cut(self.lengths, max_context).num_cut_docs}
        return {"name": self.name, **self.stats.to_dict(), **cut, "source": self.source}


def bundled_datasets() -> tuple[str, ...]:
    """Short names of the datasets shipped inside the package, in a fixed order."""
    return tuple(BUNDLED)


def load_dataset(name_or_path: str | Path, *, column: str | None = None) -> Dataset:
    """A bundled name, a synthetic spec, or a length file -> ``Dataset`` (see the module doc).

    ``column`` applies to files only (the CSV/Parquet column or JSONL key to read); it is ignored
    for bundled and synthetic datasets.
    """
    if isinstance(name_or_path, str):
        if name_or_path in BUNDLED:
            return _load_bundled(name_or_path)
        if name_or_path == SYNTHETIC_NAME or name_or_path.startswith(SYNTHETIC_NAME + ":"):
            config = parse_synthetic(name_or_path)
            return Dataset(name=name_or_path, lengths=synthetic_lengths(config),
                           source=config.describe())
    path = Path(name_or_path)
    if not path.exists():
        raise UserError(f"unknown dataset {str(name_or_path)!r}: no such file, and not a bundled "
                        f"dataset ({', '.join(BUNDLED)}) nor 'synthetic[:k=v,...]'")
    lengths = load_lengths(path, column=column)
    where = f"column {column!r}" if column else "default column"
    return Dataset(name=str(name_or_path), lengths=lengths,
                   source=f"file {path.resolve()} ({path.suffix.lstrip('.')}, {where})")


@functools.cache
def _load_bundled(name: str) -> Dataset:
    # Cached: a Dataset is immutable, and the sampler and CLI may ask for the same one often.
    spec = BUNDLED[name]
    resource = resources.files(__package__).joinpath("bundled", spec.file)
    with resource.open("rb") as handle, np.load(handle, allow_pickle=False) as archive:
        raw = archive["lengths"]
    lengths = raw.astype(np.int64)
    lengths.flags.writeable = False
    return Dataset(name=name, lengths=lengths, source=spec.source)


def bundled_path(name: str) -> Path:
    """File of a bundled dataset inside the installed package (for tools that want the raw file)."""
    if name not in BUNDLED:
        raise UserError(f"unknown bundled dataset {name!r}; bundled: {', '.join(BUNDLED)}")
    return Path(str(resources.files(__package__).joinpath("bundled", BUNDLED[name].file)))
