"""``slimpack datasets``: table and JSON output, exit codes, one-line errors (run in-process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slimpack.cli.main import COMMANDS, main
from slimpack.data import bundled_datasets

KEYS = ["name", "count", "total_tokens", "mean", "median", "p99", "max", "share_tokens_over_32k", "max_context",
        "docs_over_context", "source"]


def test_registered():
    assert COMMANDS["datasets"] == "slimpack.cli.datasets"


def test_table_lists_every_bundled_dataset(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in bundled_datasets():
        assert name in out
    for figure in ("1,000,000", "1,013.6", "347", "10,919.0", "1,823,777", "7.6%", "Hetu-Galvatron"):
        assert figure in out


def test_json_has_stable_keys_and_real_values(capsys):
    assert main(["datasets", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == list(bundled_datasets())
    assert all(list(r) == KEYS for r in records)
    wikipedia = records[0]
    assert (wikipedia["count"], wikipedia["max"], wikipedia["median"]) == (1_000_000, 1_823_777, 347.0)
    assert wikipedia["total_tokens"] == 1_013_648_780
    assert round(wikipedia["share_tokens_over_32k"], 3) == 0.076
    assert (wikipedia["max_context"], wikipedia["docs_over_context"]) == (131072, 49)


def test_documents_over_the_context_are_counted(tmp_path, capsys):
    # 10 and 40000 fit 64K; 70000 and 200000 do not (200000 = 4 chunks of 65536: 3 extra samples)
    (tmp_path / "a.txt").write_text("10\n70000\n40000\n200000\n")
    assert main(["datasets", "--json", "--max-context", "64K", str(tmp_path / "a.txt")]) == 0
    assert json.loads(capsys.readouterr().out)[0]["docs_over_context"] == 2
    assert main(["datasets", "--max-context", "32K", str(tmp_path / "a.txt")]) == 0
    assert "32768-token" in capsys.readouterr().out


def test_given_files_and_names(tmp_path, capsys):
    (tmp_path / "a.csv").write_text("id,n\n1,10\n2,40000\n")
    assert main(["datasets", "--json", "--column", "n", str(tmp_path / "a.csv"), "pydocs",
                 "synthetic:count=50"]) == 0
    first, second, third = json.loads(capsys.readouterr().out)
    assert (first["count"], first["total_tokens"], first["max"]) == (2, 40010, 40000)
    assert first["share_tokens_over_32k"] == pytest.approx(40000 / 40010)
    assert second["name"] == "pydocs" and third["count"] == 50
    assert main(["datasets", str(tmp_path / "a.csv"), "--column", "n"]) == 0
    assert "a.csv" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "fragment"), [
    (["nope"], "unknown dataset 'nope'"),
    (["{tmp}/bad.csv"], "bad.csv line 3 (column 'length'): 'x' is not a number"),
    (["{tmp}/bad.csv", "--column", "size"], "no column 'size'"),
    (["{tmp}/missing.npy"], "unknown dataset"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, fragment):
    (tmp_path / "bad.csv").write_text("length\n4\nx\n")
    assert main(["datasets", *(a.format(tmp=tmp_path) for a in args)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("slimpack datasets: error: ")
    assert fragment in lines[0]


def test_data_and_cli_do_not_import_torch():
    code = "import sys, slimpack.data, slimpack.cli.datasets; assert 'torch' not in sys.modules"
    src = str(Path(__file__).resolve().parents[2] / "src")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": src})
