"""Read a file of document lengths (tokens per document) into an int64 array, in file order.

Formats, chosen by suffix:

- ``.csv``: a header row, then one document per row. The column is ``column`` if given, else the
  first of :data:`LENGTH_COLUMNS` present, else the only column. A one-column file without a
  header (first row numeric) is read as data.
- ``.txt``: one integer per line; blank lines and lines starting with ``#`` are skipped.
- ``.jsonl``: one JSON value per line: an object holding an integer length or a token list (whose
  length is used) under ``column`` or the first of :data:`JSONL_KEYS` present, or a bare integer.
- ``.npy`` / ``.npz``: a 1-D integer array (in an ``.npz``, the array ``lengths`` or the only one).
- ``.parquet``: a column as for CSV, or a token-list column (``input_ids``, as JSONL), integers or
  token lists; needs pyarrow (``slimpack[parquet]``).

Lengths must be integers >= 1. Every problem is a :class:`~slimpack.errors.UserError` whose
message names the file and the line (text formats) or the index (array formats).

Must not import torch; pyarrow is imported only when a Parquet file is read.
"""

from __future__ import annotations

import csv
import json
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from slimpack.errors import UserError
from slimpack.files import output_path

LENGTH_COLUMNS: tuple[str, ...] = ("length", "tokens", "tokens_qwen3", "num_tokens")
"""Column names recognised as a length, in order of preference (CSV and Parquet)."""
JSONL_KEYS: tuple[str, ...] = ("length", "num_tokens", "tokens", "input_ids", "tokens_qwen3")
"""Keys recognised in a JSONL object, in order of preference; a list value counts its items."""
PARQUET_COLUMNS: tuple[str, ...] = (*LENGTH_COLUMNS, "input_ids")
"""Columns recognised in a Parquet file, in order of preference: a length, else a tokenized text."""

# Beyond this a "length" is certainly a corrupt value, and sums of such values would overflow int64.
_MAX_LENGTH = 2**40


def load_lengths(path: str | Path, *, column: str | None = None) -> np.ndarray:
    """Read ``path`` and return its lengths as a new int64 array in file order.

    ``column`` picks the CSV/Parquet column or JSONL key; without it the usual names are tried.
    """
    path = Path(path)
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise UserError(f"{path}: unsupported suffix {path.suffix!r}; expected one of "
                        f"{', '.join(sorted(_READERS))}")
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if not path.is_file():
        raise UserError(f"{path}: not a regular file")
    if path.stat().st_size == 0:
        raise UserError(f"{path}: empty file")
    try:
        lengths = reader(path, column)
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except csv.Error as exc:
        raise UserError(f"{path}: malformed CSV ({exc})") from None
    if lengths.size == 0:
        raise UserError(f"{path}: no lengths in file")
    return lengths


# ---------------------------------------------------------------- text formats


def _parse_int(text: str, where: str) -> int:
    """One length from text; ``where`` ("file line N") prefixes the message."""
    raw = text.strip()
    if not raw:
        raise UserError(f"{where}: empty value")
    try:
        value = int(raw)
    except ValueError:
        try:
            float(raw)
        except ValueError:
            raise UserError(f"{where}: {raw!r} is not a number") from None
        raise UserError(f"{where}: {raw!r} is not an integer") from None
    return _check_value(value, where)


def _check_value(value: int, where: str) -> int:
    if value < 1:
        raise UserError(f"{where}: length {value} must be >= 1")
    if value > _MAX_LENGTH:
        raise UserError(f"{where}: length {value} is implausibly large (> 2**40)")
    return value


def _read_txt(path: Path, column: str | None) -> np.ndarray:
    if column is not None:
        raise UserError(f"{path}: a .txt file has no columns (got column={column!r})")
    out: list[int] = []
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(_parse_int(line, f"{path} line {number}"))
    return np.array(out, dtype=np.int64)


def _read_csv(path: Path, column: str | None) -> np.ndarray:
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        header = next((row for row in reader if row), None)
        if header is None:
            raise UserError(f"{path}: empty file")
        names = [name.strip() for name in header]
        if len(names) == 1 and column is None and _is_int(names[0]):
            # One column and a numeric first row: a header-less list of lengths.
            first: list[tuple[int, str]] = [(reader.line_num, names[0])]
            index = 0
        else:
            index = _pick_column(names, column, path)
            first = []
        cells: Iterable[tuple[int, str]] = (
            (reader.line_num, row[index] if index < len(row) else "") for row in reader if row)
        return _parse_cells([*first, *cells], path, f"column {names[index]!r}")


def _parse_cells(cells: list[tuple[int, str]], path: Path, what: str) -> np.ndarray:
    """Fast path through numpy; on any failure walk the cells to name the first bad line."""
    if cells:
        try:
            values = np.array([text for _, text in cells]).astype(np.int64)
            if values.min() >= 1 and values.max() <= _MAX_LENGTH:
                return values
        except (ValueError, OverflowError):
            pass
    out = [_parse_int(text, f"{path} line {line} ({what})") for line, text in cells]
    return np.array(out, dtype=np.int64)


def _read_jsonl(path: Path, column: str | None) -> np.ndarray:
    out: list[int] = []
    key = column
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{where}: invalid JSON ({exc.msg})") from None
            if isinstance(item, dict):
                if key is None:  # decided by the first object, then required on every line
                    key = next((k for k in JSONL_KEYS if k in item), None)
                    if key is None:
                        raise UserError(f"{where}: no length key; expected one of "
                                        f"{list(JSONL_KEYS)}, found {sorted(item)}")
                if key not in item:
                    raise UserError(f"{where}: missing key {key!r}")
                item = item[key]
            out.append(_json_length(item, where))
    return np.array(out, dtype=np.int64)


def _json_length(item: object, where: str) -> int:
    if isinstance(item, list):
        return _check_value(len(item), where)
    if isinstance(item, bool) or not isinstance(item, (int, float)):
        raise UserError(f"{where}: expected an integer length or a token list, got {item!r}")
    if isinstance(item, float):
        raise UserError(f"{where}: {item!r} is not an integer")
    return _check_value(item, where)


# ---------------------------------------------------------------- array formats


def _read_npy(path: Path, column: str | None) -> np.ndarray:
    if column is not None:
        raise UserError(f"{path}: a .npy file has no columns (got column={column!r})")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        # numpy's message for object arrays suggests allow_pickle, which would run code from the file
        reason = "it holds Python objects; save the lengths as an integer array" if "pickle" in str(exc) else exc
        raise UserError(f"{path}: not a readable .npy file ({reason})") from None
    return _check_array(array, path)


def _read_npz(path: Path, column: str | None) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = list(archive.files)
            key = column or ("lengths" if "lengths" in names else names[0] if len(names) == 1 else None)
            if key is None or key not in names:
                raise UserError(f"{path}: no array {column or 'lengths'!r}; arrays: {names}")
            array = archive[key]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise UserError(f"{path}: not a readable .npz file ({exc})") from None
    return _check_array(array, path)


def _check_array(array: np.ndarray, path: Path) -> np.ndarray:
    if array.ndim != 1:
        raise UserError(f"{path}: expected a 1-D array of lengths, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise UserError(f"{path}: array dtype {array.dtype} is not an integer type; lengths are "
                        f"whole token counts")
    if array.size:
        bad = np.flatnonzero((array < 1) | (array > _MAX_LENGTH))
        if bad.size:
            _check_value(int(array[bad[0]]), f"{path} index {bad[0]}")
    return array.astype(np.int64)


def require_pyarrow(what: str) -> None:
    """Refuse in one line when pyarrow (an optional extra) is missing."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise UserError(f"{what} needs pyarrow: install slimpack[parquet]") from None


def _read_parquet(path: Path, column: str | None) -> np.ndarray:
    require_pyarrow(f"{path}: reading Parquet")
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        name = schema.names[_pick_column(list(schema.names), column, path, PARQUET_COLUMNS)]
        data = pq.read_table(path, columns=[name]).column(name)
    except UserError:
        raise
    except Exception as exc:  # pyarrow raises its own error types for corrupt files
        raise UserError(f"{path}: not a readable Parquet file ({exc})") from None
    if data.null_count:
        first = int(np.flatnonzero(data.is_null().to_numpy(zero_copy_only=False))[0])
        raise UserError(f"{path} row {first}: column {name!r} is null")
    kind = str(data.type)
    if kind.startswith(("list", "large_list", "fixed_size_list")):
        data = pc.list_value_length(data)
    array = data.to_numpy()
    if array.dtype.kind not in "iu":
        raise UserError(f"{path}: column {name!r} has type {kind}; expected integers or token lists")
    if array.size:
        bad = np.flatnonzero((array < 1) | (array > _MAX_LENGTH))
        if bad.size:
            _check_value(int(array[bad[0]]), f"{path} row {bad[0]} (column {name!r})")
    return array.astype(np.int64)


# ---------------------------------------------------------------- helpers


def _pick_column(names: list[str], column: str | None, path: Path,
                 candidates: tuple[str, ...] = LENGTH_COLUMNS) -> int:
    lowered = [name.lower() for name in names]
    if column is not None:
        if column.lower() in lowered:
            return lowered.index(column.lower())
        raise UserError(f"{path}: no column {column!r}; columns: {names}")
    for candidate in candidates:
        if candidate in lowered:
            return lowered.index(candidate)
    if len(names) == 1:
        return 0
    raise UserError(f"{path}: no length column; expected one of {list(candidates)} or a single "
                    f"column, found {names} (pick one: --column NAME on the command line, column= in the API)")


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _open_text(path: Path):
    # utf-8-sig: spreadsheet exports often start with a byte-order mark.
    return path.open("r", encoding="utf-8-sig", newline="")


_READERS: dict[str, Callable[[Path, str | None], np.ndarray]] = {
    ".csv": _read_csv,
    ".txt": _read_txt,
    ".jsonl": _read_jsonl,
    ".npy": _read_npy,
    ".npz": _read_npz,
    ".parquet": _read_parquet,
}

SUFFIXES: tuple[str, ...] = tuple(sorted(_READERS))
"""File suffixes :func:`load_lengths` understands."""
WRITABLE_SUFFIXES: tuple[str, ...] = (".csv", ".npy", ".txt")
"""File suffixes :func:`save_lengths` writes."""


def check_length_file_name(path: str | Path) -> str:
    """The suffix of a length file to write, refused unless :func:`save_lengths` writes it."""
    suffix = Path(path).suffix.lower()
    if suffix not in WRITABLE_SUFFIXES:
        raise UserError(f"{path}: a length file must end in {', '.join(WRITABLE_SUFFIXES)}")
    return suffix


def save_lengths(lengths: np.ndarray, path: str | Path) -> None:
    """Write lengths so that :func:`load_lengths` reads them back: ``.npy`` (int64), ``.csv`` (a
    ``length`` column) or ``.txt`` (one per line)."""
    suffix = check_length_file_name(path)  # before any folder is made for a name that is refused
    path = output_path(path)
    lengths = np.asarray(lengths, dtype=np.int64)
    if suffix == ".npy":
        np.save(path, lengths)
    else:
        header = "length\n" if suffix == ".csv" else ""
        path.write_text(header + "".join(f"{n}\n" for n in lengths.tolist()))
