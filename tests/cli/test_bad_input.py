"""Every bad input a new user might give: one line on stderr, exit 2, no traceback, nothing on stdout
and no file written, refused before the work starts (issue 11's list)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from slimpack.compare import Window, compare
from slimpack.compare import report as report_module
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.data import load_dataset
from slimpack.plan import save_plan
from text_fixtures import write_saved_dataset, write_tokenizer

SMALL_COMPARE = ["compare", "--dataset", "pydocs", "--max-context", "32K", "--global-batch-tokens", "256K",
                 "--tp", "8", "--pp", "2", "--dp", "2", "--warmup", "0", "--steps", "1", "--strategies", "fixed"]


@pytest.fixture
def files(tmp_path, small_plan):
    binary = tmp_path / "binary.json"
    binary.write_bytes(bytes(range(256)) * 4)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2, 3]\n")
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    plan = tmp_path / "plan.json"
    save_plan(small_plan, plan)
    no_sp = tmp_path / "no-sp.json"
    no_sp.write_text(json.dumps(build_config(model="tiny", parallel=ParallelConfig(tp=2, sequence_parallel=False))
                                .to_dict()))
    return {"BIN": str(binary), "LIST": str(listed), "OBJ": str(objects), "PLAN": str(plan), "NOSP": str(no_sp)}


def _bad_input(cli, capsys, tmp_path, argv, message):
    before = sorted(tmp_path.iterdir())
    assert cli(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err
    assert sorted(tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize(("argv", "message"), [
    (["cost", "--tokens", "10", "--config", "BIN"], "is not a JSON text file"),
    (["cost", "--tokens", "10", "--config", "LIST"], "expected a JSON object"),
    (["validate", "BIN"], "is not a JSON text file"),
    (["simulate", "BIN"], "is not a JSON text file"),
    (["datasets", "OBJ"], "save the lengths as an integer array"),
    (["plan", "--dataset", "OBJ"], "save the lengths as an integer array"),
    ([*SMALL_COMPARE, "--report", "/proc/slimpack-report"], "--report /proc/slimpack-report: cannot write there"),
    ([*SMALL_COMPARE, "--json", "/sys/slimpack.json"], "--json /sys/slimpack.json: cannot write there"),
    (["simulate", "PLAN", "--trace", "/proc/x/trace.json"], "--trace /proc/x/trace.json: cannot write there"),
    # tune checked none of its outputs before the search, so a bad one failed after minutes of work
    (["tune", "--gpus", "8", "--json", "/sys/slimpack.json"], "--json /sys/slimpack.json: cannot write there"),
    (["tune", "--gpus", "8", "--output", "/proc/x/best.json"], "--output /proc/x/best.json: cannot write there"),
    (["plan", "--output", "/sys/plan.json"], "--output /sys/plan.json: cannot write there"),
    (["plan", "--step", "-1"], "expected an integer >= 0"),
    (["compare", "--warmup", "-1"], "expected an integer >= 0"),
    (["compare", "--steps", "0"], "expected a positive integer"),
    (["plan", "--milp-time-limit", "nan"], "expected a finite number > 0"),
    # a context of a few tokens (a K or M left out) would cut wikipedia into ~10^9 samples
    (["plan", "--max-context", "4", "--global-batch-tokens", "64K"], "samples per epoch at max_context 4"),
    (["plan", "--max-context", "4K", "--micro-batch-tokens", "1K"], "micro_batch_tokens must be at least max_context"),
])
def test_planning_commands(cli, capsys, tmp_path, files, argv, message):
    _bad_input(cli, capsys, tmp_path, [files.get(a, a) for a in argv], message)


def test_outputs_land_in_folders_made_for_them_and_a_file_in_the_way_is_refused_first(cli, capsys, tmp_path):
    # a missing folder used to fail the write at the end of the run, after the work
    nested = tmp_path / "a" / "b" / "p.json"
    assert cli(["plan", "--model", "tiny", "--tp", "1", "--pp", "1", "--dp", "1", "--max-context", "2K",
                "--global-batch-tokens", "8K", "--output", str(nested)]) == 0
    assert json.loads(nested.read_text())["format"] == "slimpack-plan"
    assert cli([*SMALL_COMPARE, "--json", str(tmp_path / "c" / "x.json")]) == 0
    assert [row["strategy"] for row in json.loads((tmp_path / "c" / "x.json").read_text())["strategies"]] == ["fixed"]
    capsys.readouterr()
    (tmp_path / "blocker").write_text("")
    _bad_input(cli, capsys, tmp_path, [*SMALL_COMPARE, "--json", str(tmp_path / "blocker" / "x.json")],
               f"cannot write there ({tmp_path / 'blocker'} is a file, where the path needs a folder)")
    # an input error leaves no folder for the output behind
    _bad_input(cli, capsys, tmp_path, ["plan", "--step", "0", "--max-context", "4", "--global-batch-tokens", "64K",
                                       "--output", str(tmp_path / "d" / "p.json")], "samples per epoch")


@pytest.fixture
def text_files(tmp_path):
    """A tokenizer, a saved dataset, a tokenized Parquet file and broken variants (issue 17's inputs)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tokenizer = write_tokenizer(tmp_path / "tok")
    saved = write_saved_dataset(tmp_path / "saved", ["the cat", "sat"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "notok").mkdir()
    (tmp_path / "badtok").mkdir()
    (tmp_path / "badtok" / "tokenizer.json").write_text('{"model": 3}')
    (tmp_path / "notext.jsonl").write_text('{"body": "the cat"}\n')
    (tmp_path / "broken.parquet").write_text("not parquet")
    (tmp_path / "brokenarrow").mkdir()
    (tmp_path / "brokenarrow" / "data-00000-of-00001.arrow").write_text("not arrow")
    pq.write_table(pa.table({"text": ["a b", "c"], "input_ids": [[1, 2], [3]]}), tmp_path / "tokens.parquet")
    return {"TOK": str(tokenizer), "SAVED": str(saved), "EMPTY": str(tmp_path / "empty"),
            "NOTOK": str(tmp_path / "notok"), "BADTOK": str(tmp_path / "badtok"),
            "NOTEXT": str(tmp_path / "notext.jsonl"), "TOKENS": str(tmp_path / "tokens.parquet"),
            "OUT": str(tmp_path / "out.npy"), "BROKENPQ": str(tmp_path / "broken.parquet"),
            "BROKENARROW": str(tmp_path / "brokenarrow")}


@pytest.mark.parametrize(("argv", "message"), [
    (["lengths", "SAVED", "--tokenizer", "NOTOK", "-o", "OUT"], "no tokenizer.json"),
    (["lengths", "SAVED", "--tokenizer", "BADTOK", "-o", "OUT"], "not a readable tokenizer.json"),
    (["lengths", "SAVED", "--tokenizer", "TOK", "-o", "lengths.json"], "a length file must end in .csv, .npy, .txt"),
    (["lengths", "SAVED", "--tokenizer", "TOK", "-o", "OUT", "--split", "train"], "not a DatasetDict directory"),
    (["lengths", "SAVED", "--tokenizer", "TOK", "-o", "OUT", "--text-column", "id"], "column 'id' has type int64, not text"),
    (["lengths", "EMPTY", "--tokenizer", "TOK", "-o", "OUT"], "no state.json nor .arrow files"),
    (["lengths", "NOTEXT", "--tokenizer", "TOK", "-o", "OUT"], "line 1: no text under key 'text'"),
    (["lengths", "TOKENS", "--tokenizer", "TOK", "-o", "OUT", "--split", "x"], "--split applies to a datasets directory"),
    (["lengths", "TOKENS", "--tokenizer", "TOK", "-o", "OUT", "--text-column", "input_ids"], "column 'input_ids' has type list<"),
    (["lengths", "BROKENPQ", "--tokenizer", "TOK", "-o", "OUT"], "not a readable Parquet file"),
    (["lengths", "BROKENARROW", "--tokenizer", "TOK", "-o", "OUT"], "not a readable arrow file"),
    (["compare", "--dataset", "TOKENS", "--column", "nope"], "no column 'nope'; columns: ['text', 'input_ids']"),
    (["plan", "--dataset", "TOKENS", "--column", "text"], "column 'text' has type string; expected integers or token lists"),
    (["tune", "--gpus", "8", "--dataset", "TOKENS", "--column", "nope"], "no column 'nope'"),
    (["datasets", "--max-context", "0"], "expected a positive integer"),
])
def test_dataset_inputs(cli, capsys, tmp_path, text_files, argv, message):
    _bad_input(cli, capsys, tmp_path, [text_files.get(a, a) for a in argv], message)


@pytest.mark.parametrize(("argv", "message"), [
    (["verify", "--plan", "BIN"], "is not a JSON text file"),
    (["verify", "--plan", "PLAN", "--device", "cuda"], "this torch sees no CUDA device"),
    (["verify", "--plan", "PLAN", "--device", "tpu"], "is not a torch device"),
    (["verify", "--plan", "PLAN", "--device", "xpu"], "the runtime runs on cpu or cuda"),
    (["verify", "--plan", "PLAN", "--device", "nonsense"], "is not a torch device"),
    (["verify", "--plan", "PLAN", "--model", "llama2-70b"], "use a smaller --model"),
    (["verify", "--plan", "PLAN", "--tolerance", "-1"], "expected a finite number > 0"),
    (["verify", "--plan", "PLAN", "--backend", "flash"], "--backend: attention backend 'flash' cannot run"),
    (["verify", "--plan", "PLAN", "--precision", "bf16", "--dtype", "float64"], "keeps float32 master weights"),
    (["train", "--lr", "-1"], "expected a finite number > 0"),
    (["train", "--lr", "nan"], "expected a finite number > 0"),
    (["train", "--timeout", "0"], "expected a finite number > 0"),
    (["train", "--attention", "flash"], "--attention: attention backend 'flash' cannot run"),
    (["train", "--trace-dir", "/sys/slimpack-traces"], "--trace-dir /sys/slimpack-traces: cannot write there"),
    (["train", "--log-json", "/proc/x/log.json"], "--log-json /proc/x/log.json: cannot write there"),
    (["train", "--pp", "2"], "needs 2 processes"),
    (["train", "--milp"], "--milp: slimpack train plans every step on every rank"),
    (["fidelity", "--dataset", "OBJ", "--column", "n"], "a .npy file has no columns (got column='n')"),
    (["train", "--precision", "bf16", "--dtype", "float64"], "keeps float32 master weights: use --dtype float32"),
    (["train", "--config", "NOSP"], "tp=2 with sequence_parallel false"),
    (["fidelity", "--config", "NOSP"], "tp=2 with sequence_parallel false"),
])
def test_runtime_commands(cli, capsys, tmp_path, files, argv, message, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and "--device" in argv:
        pytest.skip("this machine has a CUDA device")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _bad_input(cli, capsys, tmp_path, [files.get(a, a) for a in argv], message)


def test_prefix_takes_a_suffix_like_tokens(cli, capsys):
    assert cli(["cost", "--tokens", "8K", "--prefix", "120K", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefix"] == 120 * 1024


def test_an_interrupted_report_leaves_nothing(tmp_path, monkeypatch):
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=2, dp=2),
                          train=TrainConfig(max_context=32768, global_batch_tokens=1 << 18))
    comparison = compare(config, load_dataset("pydocs"), ["fixed"], Window(warmup_steps=0, steps=1))

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_module, "group_time_chart", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report_module.write_report(comparison, tmp_path / "report", command=["slimpack", "compare"])
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    report_module.write_report(comparison, tmp_path / "report", command=["slimpack", "compare"])
    assert [p.name for p in tmp_path.iterdir()] == ["report"]  # no staging folder left beside it
    assert (tmp_path / "report" / "report.html").stat().st_size > 1000
