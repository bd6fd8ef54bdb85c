"""``slimpack lengths``: token counts of local text datasets with a local tokenizer, written as a
length file that the other commands read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from slimpack.data import load_lengths
from slimpack.data.count_tokens import count_tokens
from text_fixtures import TEXTS, WORDS, write_saved_dataset, write_tokenizer

pytest.importorskip("tokenizers")
pytest.importorskip("pyarrow")

WITH_BOS = [n + 1 for n in WORDS]  # the tokenizer's post-processor adds <s> to every document
NON_EMPTY = [n for n in WORDS if n]


def test_a_saved_dataset_directory(tmp_path, cli, capsys):
    tokenizer = write_tokenizer(tmp_path / "tok")
    saved = write_saved_dataset(tmp_path / "ds", TEXTS)
    assert count_tokens(saved, tokenizer).lengths.tolist() == WITH_BOS
    counts = count_tokens(saved, tokenizer / "tokenizer.json", special_tokens=False)
    assert counts.lengths.tolist() == NON_EMPTY and counts.num_empty == 1 and counts.text_column == "text"
    out = tmp_path / "lengths.csv"
    assert cli(["lengths", str(saved), "--tokenizer", str(tokenizer), "-o", str(out)]) == 0
    assert f"5 documents, {sum(WITH_BOS)} tokens (column 'text', longest 5)" in capsys.readouterr().err
    assert load_lengths(out).tolist() == WITH_BOS
    # the file is a --dataset of the other commands
    assert cli(["datasets", "--json", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["total_tokens"] == sum(WITH_BOS)


def test_a_dataset_dict_jsonl_and_parquet_agree(tmp_path, cli, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tokenizer = write_tokenizer(tmp_path / "tok")
    write_saved_dataset(tmp_path / "dd" / "train", TEXTS)
    write_saved_dataset(tmp_path / "dd" / "test", TEXTS[:2])
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"body": t, "n": 1}) + "\n" for t in TEXTS))
    pq.write_table(pa.table({"body": TEXTS, "n": [1] * len(TEXTS)}), tmp_path / "t.parquet")
    for source, extra in (("dd", []), ("dd", ["--split", "test"]), ("t.jsonl", ["--text-column", "body"]),
                          ("t.parquet", []), ("t.parquet", ["--text-column", "body"])):
        out = tmp_path / "out.npy"
        assert cli(["lengths", str(tmp_path / source), "--tokenizer", str(tokenizer), "--no-special-tokens",
                    "-o", str(out), *extra]) == 0, capsys.readouterr().err
        expected = [3, 2] if extra == ["--split", "test"] else NON_EMPTY
        assert np.load(out).tolist() == expected


def test_planning_from_the_counted_lengths(tmp_path, cli):
    tokenizer = write_tokenizer(tmp_path / "tok")
    saved = write_saved_dataset(tmp_path / "ds", [" ".join(["the"] * n) for n in (700, 300, 1500, 50)])
    assert cli(["lengths", str(saved), "--tokenizer", str(tokenizer), "-o", str(tmp_path / "l.txt")]) == 0
    assert load_lengths(tmp_path / "l.txt").tolist() == [701, 301, 1501, 51]
    assert cli(["plan", "--dataset", str(tmp_path / "l.txt"), "--strategy", "kk", "--max-context", "1K",
                "--global-batch-tokens", "2554", "--tp", "1", "--pp", "1", "--dp", "2", "--model", "tiny",
                "-o", str(tmp_path / "p.json")]) == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    # one epoch (2554 tokens) per batch; 1501 tokens at a 1K context: one cut document, two samples
    assert sorted(s["length"] for s in plan["samples"]) == [51, 301, 477, 701, 1024]
