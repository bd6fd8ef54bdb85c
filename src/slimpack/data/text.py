"""Real text that every machine has offline: the CPython standard library's ``*.py`` sources, read as
bytes (a byte-level tokenizer: token = byte, vocabulary 256, the ``tiny`` model's).

``TextCorpus.stdlib()`` lists the files under ``sysconfig.get_paths()["stdlib"]`` (site-packages
left out) in sorted path order; a document's length is its size in bytes, so the corpus is also a
``Dataset`` of lengths for the batch sampler, which cuts documents at ``max_context``. A sampler
``DocumentChunk`` (document, chunk, offset) maps back to its bytes with ``sample_tokens``.
Must not import torch.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slimpack.data.dataset import Dataset
from slimpack.data.sampler import DocumentChunk
from slimpack.errors import UserError

VOCAB_SIZE = 256


@dataclass(frozen=True, slots=True)
class TextCorpus:
    root: Path
    paths: tuple[Path, ...]
    """Documents in data order (sorted relative paths)."""

    @staticmethod
    def stdlib(max_files: int | None = None) -> TextCorpus:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = sorted((p for p in root.rglob("*.py")
                        if "site-packages" not in p.parts and "dist-packages" not in p.parts and p.is_file()),
                       key=lambda p: p.relative_to(root).as_posix())
        files = [p for p in files if p.stat().st_size > 0]
        if not files:
            raise UserError(f"no *.py files under {root}: the standard library sources are needed for training text")
        return TextCorpus(root=root, paths=tuple(files[:max_files] if max_files else files))

    def dataset(self) -> Dataset:
        lengths = np.array([p.stat().st_size for p in self.paths], dtype=np.int64)
        return Dataset(name="cpython-stdlib", lengths=lengths,
                       source=f"{len(self.paths)} *.py files under {self.root} (bytes, sorted paths)")

    def sample_tokens(self, source: DocumentChunk, max_context: int) -> bytes:
        """The bytes of the sampler's sample ``source`` (a document, a chunk of it, or a piece of one)."""
        start, end = source.token_range(max_context)
        piece = self.paths[source.doc_index].read_bytes()[start:end]
        if len(piece) != end - start:
            raise UserError(f"{self.paths[source.doc_index]} changed while training: expected {end - start} bytes "
                            f"at {start}")
        return piece
