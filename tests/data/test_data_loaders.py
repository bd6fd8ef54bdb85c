"""Length-file loaders: every format reads in file order; every malformed file names file and line."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from slimpack.data.loaders import load_lengths
from slimpack.errors import UserError

EXPECTED = [5, 1, 300, 70000]


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- good files, every format


@pytest.mark.parametrize("header", ["length", "tokens", "tokens_qwen3", "num_tokens", "Length"])
def test_csv_known_column_names(tmp_path, header):
    path = write(tmp_path, "a.csv", f"{header}\n" + "\n".join(map(str, EXPECTED)) + "\n")
    lengths = load_lengths(path)
    assert lengths.dtype == np.int64
    assert lengths.tolist() == EXPECTED


def test_csv_prefers_length_and_honours_column(tmp_path):
    rows = "\n".join(f"f{i}.py,{n * 4},{n + 1},{n}" for i, n in enumerate(EXPECTED))
    path = write(tmp_path, "a.csv", "path,bytes,tokens_cl100k,tokens_qwen3\n" + rows + "\n")
    assert load_lengths(path).tolist() == EXPECTED  # tokens_qwen3 is a known name
    assert load_lengths(path, column="tokens_cl100k").tolist() == [n + 1 for n in EXPECTED]
    assert load_lengths(path, column="bytes").tolist() == [n * 4 for n in EXPECTED]


def test_csv_single_column_any_name_and_headerless(tmp_path):
    assert load_lengths(write(tmp_path, "a.csv", "seq\n5\n1\n300\n70000\n")).tolist() == EXPECTED
    assert load_lengths(write(tmp_path, "b.csv", "5\n1\n300\n70000")).tolist() == EXPECTED


def test_csv_bom_crlf_blank_lines(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes("\ufefflength\r\n5\r\n\r\n1\r\n300\r\n70000\r\n".encode())
    assert load_lengths(path).tolist() == EXPECTED


def test_txt(tmp_path):
    path = write(tmp_path, "a.txt", "# lengths\n5\n1\n\n300\n 70000 \n")
    assert load_lengths(path).tolist() == EXPECTED


def test_npy_and_npz(tmp_path):
    np.save(tmp_path / "a.npy", np.array(EXPECTED, dtype=np.uint32))
    assert load_lengths(tmp_path / "a.npy").tolist() == EXPECTED
    np.savez(tmp_path / "b.npz", lengths=np.array(EXPECTED), other=np.zeros(2))
    assert load_lengths(tmp_path / "b.npz").tolist() == EXPECTED
    np.savez(tmp_path / "c.npz", np.array(EXPECTED, dtype=np.int32))
    assert load_lengths(tmp_path / "c.npz").tolist() == EXPECTED


def test_jsonl_length_field_token_lists_and_bare_ints(tmp_path):
    lines = [{"length": n, "id": i} for i, n in enumerate(EXPECTED)]
    path = write(tmp_path, "a.jsonl", "\n".join(map(json.dumps, lines)) + "\n\n")
    assert load_lengths(path).tolist() == EXPECTED
    lists = [{"input_ids": list(range(n))} for n in (3, 1, 4)]
    path = write(tmp_path, "b.jsonl", "\n".join(map(json.dumps, lists)))
    assert load_lengths(path).tolist() == [3, 1, 4]
    path = write(tmp_path, "c.jsonl", '{"n": 7, "length": 1}\n{"n": 8, "length": 1}\n')
    assert load_lengths(path, column="n").tolist() == [7, 8]
    assert load_lengths(write(tmp_path, "d.jsonl", "4\n2\n")).tolist() == [4, 2]


def test_parquet_integers_and_token_lists(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text_id": [9, 9, 9, 9], "num_tokens": EXPECTED}), tmp_path / "a.parquet")
    assert load_lengths(tmp_path / "a.parquet").tolist() == EXPECTED
    pq.write_table(pa.table({"input_ids": [[1, 2], [3], [4, 5, 6]]}), tmp_path / "b.parquet")
    assert load_lengths(tmp_path / "b.parquet").tolist() == [2, 1, 3]


def test_parquet_token_list_column_found_beside_text(tmp_path):
    # a tokenized dataset (text + input_ids + attention_mask) as Hugging Face writes it: the token
    # list is the length, as in JSONL; a length column, when present, is preferred
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = {"text": ["a b", "c", "d e f"], "input_ids": [[5, 6], [7], [8, 9, 4]],
            "attention_mask": [[1, 1], [1], [1, 1, 1]]}
    pq.write_table(pa.table(rows), tmp_path / "t.parquet")
    assert load_lengths(tmp_path / "t.parquet").tolist() == [2, 1, 3]
    pq.write_table(pa.table({**rows, "length": [20, 10, 30]}), tmp_path / "l.parquet")
    assert load_lengths(tmp_path / "l.parquet").tolist() == [20, 10, 30]
    assert load_lengths(tmp_path / "l.parquet", column="input_ids").tolist() == [2, 1, 3]
    with pytest.raises(UserError, match=r"no column 'ids'; columns: \['text'"):
        load_lengths(tmp_path / "t.parquet", column="ids")


# ---------------------------------------------------------------- malformed files


@pytest.mark.parametrize(("name", "text", "fragments"), [
    ("a.csv", "length\n5\nabc\n", ["a.csv line 3", "'abc' is not a number"]),
    ("a.csv", "length\n5\n2.5\n", ["a.csv line 3", "'2.5' is not an integer"]),
    ("a.csv", "length\n5\n7\n0\n", ["a.csv line 4", "length 0 must be >= 1"]),
    ("a.csv", "length\n-4\n", ["a.csv line 2", "length -4 must be >= 1"]),
    ("a.csv", "length,x\n5,1\n,2\n", ["a.csv line 3", "empty value"]),
    ("a.csv", "length\n", ["a.csv", "no lengths"]),
    ("a.csv", "path,bytes\nx,5\n", ["a.csv", "no length column", "'path'", "'bytes'", "--column NAME"]),
    ("a.txt", "5\n\n6\nseven\n", ["a.txt line 4", "'seven' is not a number"]),
    ("a.txt", "5\n1e3\n", ["a.txt line 2", "not an integer"]),
    ("a.jsonl", '{"length": 5}\n{"length": 0}\n', ["a.jsonl line 2", "length 0 must be >= 1"]),
    ("a.jsonl", '{"length": 5}\n{"length": 2.5}\n', ["a.jsonl line 2", "2.5 is not an integer"]),
    ("a.jsonl", '{"length": 5}\n{"len": 3}\n', ["a.jsonl line 2", "missing key 'length'"]),
    ("a.jsonl", '{"length": 5}\n{oops\n', ["a.jsonl line 2", "invalid JSON"]),
    ("a.jsonl", '{"text": "hi"}\n', ["a.jsonl line 1", "no length key"]),
    ("a.jsonl", '{"tokens": []}\n', ["a.jsonl line 1", "length 0 must be >= 1"]),
    ("a.jsonl", '{"length": true}\n', ["a.jsonl line 1", "expected an integer length"]),
    ("a.tsv", "5\n", ["a.tsv", "unsupported suffix '.tsv'", ".csv"]),
])
def test_malformed_text_files_name_file_and_line(tmp_path, name, text, fragments):
    with pytest.raises(UserError) as info:
        load_lengths(write(tmp_path, name, text))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_missing_empty_and_column_errors(tmp_path):
    with pytest.raises(UserError, match=r"nope\.csv: no such file"):
        load_lengths(tmp_path / "nope.csv")
    with pytest.raises(UserError, match=r"e\.csv: empty file"):
        load_lengths(write(tmp_path, "e.csv", ""))
    with pytest.raises(UserError, match=r"no column 'size'; columns: \['length'\]"):
        load_lengths(write(tmp_path, "a.csv", "length\n5\n"), column="size")
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(UserError, match="not a regular file"):
        load_lengths(tmp_path / "d.csv")
    path = tmp_path / "latin.csv"
    path.write_bytes(b"length\n5\n\xff\n")
    with pytest.raises(UserError, match="latin.csv: not UTF-8"):
        load_lengths(path)


def test_malformed_arrays_name_file_and_index(tmp_path):
    np.save(tmp_path / "f.npy", np.array([1.0, 2.0]))
    with pytest.raises(UserError, match=r"f\.npy: array dtype float64 is not an integer"):
        load_lengths(tmp_path / "f.npy")
    np.save(tmp_path / "z.npy", np.array([3, 4, 0, 5]))
    with pytest.raises(UserError, match=r"z\.npy index 2: length 0 must be >= 1"):
        load_lengths(tmp_path / "z.npy")
    np.save(tmp_path / "m.npy", np.ones((2, 2), dtype=np.int64))
    with pytest.raises(UserError, match=r"m\.npy: expected a 1-D array"):
        load_lengths(tmp_path / "m.npy")
    write(tmp_path, "g.npy", "not numpy")
    with pytest.raises(UserError, match=r"g\.npy: not a readable \.npy"):
        load_lengths(tmp_path / "g.npy")
    np.savez(tmp_path / "n.npz", a=np.ones(2, np.int64), b=np.ones(2, np.int64))
    with pytest.raises(UserError, match=r"n\.npz: no array 'lengths'"):
        load_lengths(tmp_path / "n.npz")


def test_malformed_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"length": [4, None, 2]}), tmp_path / "n.parquet")
    with pytest.raises(UserError, match=r"n\.parquet row 1: column 'length' is null"):
        load_lengths(tmp_path / "n.parquet")
    pq.write_table(pa.table({"length": [4, 3, -2]}), tmp_path / "z.parquet")
    with pytest.raises(UserError, match=r"z\.parquet row 2 \(column 'length'\): length -2"):
        load_lengths(tmp_path / "z.parquet")
    pq.write_table(pa.table({"length": [1.5, 2.0]}), tmp_path / "f.parquet")
    with pytest.raises(UserError, match=r"f\.parquet: column 'length' has type double"):
        load_lengths(tmp_path / "f.parquet")
    write(tmp_path, "bad.parquet", "not parquet at all")
    with pytest.raises(UserError, match=r"bad\.parquet: not a readable Parquet"):
        load_lengths(tmp_path / "bad.parquet")


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    write(tmp_path, "a.parquet", "whatever")
    # A None entry in sys.modules makes the import raise ImportError, as if pyarrow were absent.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "pyarrow.compute", None)
    with pytest.raises(UserError, match=r"a\.parquet: .*install slimpack\[parquet\]"):
        load_lengths(tmp_path / "a.parquet")
