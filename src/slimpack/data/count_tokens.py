"""Lengths in tokens of a text dataset, counted with a local tokenizer (``slimpack lengths``).

Sources:

- a Hugging Face ``datasets`` directory written by ``save_to_disk`` (``state.json`` and ``*.arrow``
  files; a ``DatasetDict`` directory holds one such directory per split, named in
  ``dataset_dict.json``). The arrow files are read with pyarrow, so the ``datasets`` package is not
  needed;
- a ``.jsonl`` file (one JSON object per line) or a ``.parquet`` file.

The text is in ``text_column`` (default ``text``, or the only string column). The tokenizer is a
local directory (or file) holding a ``tokenizer.json``, read with the ``tokenizers`` library (which
transformers itself uses); nothing is downloaded. A document counts the tokens its tokenizer
produces, special tokens (BOS/EOS from the tokenizer's post-processor) included unless
``special_tokens=False``. Documents with no token are counted and skipped (a length is >= 1).

Must not import torch; pyarrow and tokenizers are imported when used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slimpack.data.loaders import require_pyarrow
from slimpack.errors import UserError
from slimpack.files import read_data_file

DEFAULT_TEXT_COLUMN = "text"
_BATCH = 1024  # documents per tokenizer call: the Rust tokenizer parallelises inside a call


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenCounts:
    lengths: np.ndarray
    """Tokens per non-empty document, int64, in source order."""
    num_empty: int
    """Documents skipped because they have no token."""
    text_column: str
    """The column the text was read from."""


def count_tokens(source: str | Path, tokenizer: str | Path, *, text_column: str | None = None,
                 split: str | None = None, special_tokens: bool = True) -> TokenCounts:
    """Tokens per document of ``source`` (see the module doc) with the tokenizer at ``tokenizer``."""
    encoder = _load_tokenizer(Path(tokenizer))
    column, batches = _text_batches(Path(source), text_column, split)
    counts: list[int] = []
    for texts in batches:
        counts.extend(len(e.ids) for e in encoder.encode_batch(texts, add_special_tokens=special_tokens))
    lengths = np.array(counts, dtype=np.int64)
    if not lengths.size:
        raise UserError(f"{source}: no documents")
    kept = lengths[lengths > 0]
    if not kept.size:
        raise UserError(f"{source}: every document has 0 tokens")
    return TokenCounts(lengths=kept, num_empty=int(lengths.size - kept.size), text_column=column)


def _load_tokenizer(path: Path) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError("counting tokens needs the tokenizers package: install slimpack[tokenize]") from None
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{path}: no tokenizer.json (a local Hugging Face tokenizer directory or its "
                        f"tokenizer.json file; a slow tokenizer can be converted with transformers' "
                        f"AutoTokenizer.from_pretrained(dir).save_pretrained(dir))")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises its own exception type for a bad file
        raise UserError(f"{file}: not a readable tokenizer.json ({str(exc).splitlines()[0]})") from None


def _text_batches(source: Path, column: str | None, split: str | None) -> tuple[str, Iterator[list[str]]]:
    if source.is_dir():
        return _arrow_batches(_split_directory(source, split), column)
    if split is not None:
        raise UserError(f"--split applies to a datasets directory, not to the file {source}")
    if not source.is_file():
        raise UserError(f"{source}: no such file or directory")
    if source.suffix.lower() == ".jsonl":
        return _jsonl_batches(source, column or DEFAULT_TEXT_COLUMN)
    if source.suffix.lower() == ".parquet":
        require_pyarrow(f"{source}: reading Parquet")
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(source)
        except Exception as exc:  # pyarrow's own error types for a corrupt file
            raise UserError(f"{source}: not a readable Parquet file ({exc})") from None
        return _table_batches(table, column, str(source))
    raise UserError(f"{source}: expected a datasets directory (save_to_disk), a .jsonl or a .parquet file")


def _split_directory(root: Path, split: str | None) -> Path:
    """The directory of one dataset: ``root`` itself, or a split of a DatasetDict directory."""
    listing = root / "dataset_dict.json"
    if not listing.is_file():
        if split is not None:
            raise UserError(f"{root}: not a DatasetDict directory (no dataset_dict.json); drop --split")
        return root
    splits = read_data_file(listing, "dataset_dict.json").get("splits") or []
    chosen = split or (splits[0] if len(splits) == 1 else "train" if "train" in splits else None)
    if chosen not in splits:
        raise UserError(f"{root}: choose a split with --split ({', '.join(map(str, splits))})")
    return root / chosen


def _arrow_batches(directory: Path, column: str | None) -> tuple[str, Iterator[list[str]]]:
    require_pyarrow(f"{directory}: reading a datasets directory")
    import pyarrow as pa

    state = directory / "state.json"
    if state.is_file():
        files = [directory / f["filename"] for f in read_data_file(state, "state.json").get("_data_files", [])]
    else:
        files = sorted(directory.glob("*.arrow"))
    if not files:
        raise UserError(f"{directory}: no state.json nor .arrow files (expected a directory written by "
                        f"datasets' save_to_disk)")
    tables = []
    for file in files:
        try:
            with pa.memory_map(str(file)) as handle:
                tables.append(pa.ipc.open_stream(handle).read_all())  # datasets writes the stream format
        except (OSError, pa.ArrowInvalid) as exc:
            raise UserError(f"{file}: not a readable arrow file ({exc})") from None
    return _table_batches(pa.concat_tables(tables), column, str(directory))


def _table_batches(table: Any, column: str | None, where: str) -> tuple[str, Iterator[list[str]]]:
    import pyarrow as pa

    names = list(table.column_names)
    if column is None:
        strings = [n for n in names if pa.types.is_string(table.schema.field(n).type)
                   or pa.types.is_large_string(table.schema.field(n).type)]
        column = DEFAULT_TEXT_COLUMN if DEFAULT_TEXT_COLUMN in names else strings[0] if len(strings) == 1 else None
        if column is None:
            raise UserError(f"{where}: no text column; name one with --text-column (columns: {names})")
    if column not in names:
        raise UserError(f"{where}: no column {column!r}; columns: {names}")
    kind = table.schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise UserError(f"{where}: column {column!r} has type {kind}, not text")
    data = table.column(column)
    if data.null_count:
        raise UserError(f"{where}: column {column!r} has {data.null_count} null value(s)")
    texts = data.to_pylist()
    return column, (texts[i:i + _BATCH] for i in range(0, len(texts), _BATCH))


def _jsonl_batches(path: Path, column: str) -> tuple[str, Iterator[list[str]]]:
    texts: list[str] = []
    with path.open(encoding="utf-8-sig", errors="strict") as handle:
        for number, line in enumerate(_lines(handle, path), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path} line {number}: invalid JSON ({exc.msg})") from None
            text = item.get(column) if isinstance(item, dict) else None
            if not isinstance(text, str):
                raise UserError(f"{path} line {number}: no text under key {column!r} (use --text-column)")
            texts.append(text)
    return column, (texts[i:i + _BATCH] for i in range(0, len(texts), _BATCH))


def _lines(handle: Any, path: Path) -> Iterator[str]:
    try:
        yield from handle
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None


__all__ = ["DEFAULT_TEXT_COLUMN", "TokenCounts", "count_tokens"]
