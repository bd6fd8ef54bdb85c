"""Bundled datasets match their published figures; resolution by name/path; stats; synthetic data."""

from __future__ import annotations

import math
import zipfile

import numpy as np
import pytest

from slimpack.data import (
    Dataset,
    SyntheticConfig,
    bundled_datasets,
    bundled_path,
    dataset_stats,
    load_dataset,
    synthetic_lengths,
)
from slimpack.errors import UserError

# From /work/shared/data/lengths/README.md (count; mean / median / p99 / max as printed there,
# i.e. rounded down to an integer; share of tokens in documents > 32K, one decimal of a percent).
PUBLISHED = {
    "wikipedia": (1_000_000, 1013, 347, 10919, 1_823_777, 7.6),
    "textbooks": (77_932, 3051, 1913, 16269, 340_149, 4.9),
    "wlbllm": (99_519, 3961, 3227, 26058, 124_913, 17.0),
    "cpython": (1_762, 4469, 1638, 40077, 160_871, 20.9),
    "pydocs": (497, 5386, 2471, 30631, 51_807, 6.2),
}


def test_bundled_names():
    assert bundled_datasets() == tuple(PUBLISHED)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_bundled_stats_match_published_figures(name):
    count, mean, median, p99, longest, share_pct = PUBLISHED[name]
    dataset = load_dataset(name)
    stats = dataset.stats
    assert (stats.count, len(dataset), stats.max) == (count, count, longest)
    assert (math.floor(stats.mean), math.floor(stats.median), math.floor(stats.p99)) == (mean, median, p99)
    assert round(stats.share_tokens_over_32k * 100, 1) == share_pct
    assert stats.total_tokens == int(dataset.lengths.sum())
    assert dataset.source and dataset.name == name


def test_bundled_first_rows_keep_data_order():
    # First data rows of the source CSVs (data order must survive the bundling).
    assert load_dataset("wikipedia").lengths[:2].tolist() == [368, 99]
    assert load_dataset("textbooks").lengths[:2].tolist() == [2690, 6388]
    assert load_dataset("wlbllm").lengths[:2].tolist() == [2792, 4238]
    assert load_dataset("cpython").lengths[:2].tolist() == [1340, 79]
    assert load_dataset("pydocs").lengths[:2].tolist() == [309, 1035]


def test_bundled_files_and_provenance_ship_inside_the_package():
    folder = bundled_path("wikipedia").parent
    assert folder.name == "bundled" and (folder / "PROVENANCE.md").is_file()
    text = (folder / "PROVENANCE.md").read_text()
    for name in PUBLISHED:
        assert f"`{name}`" in text
        assert bundled_path(name).stat().st_size < 2_000_000
    with zipfile.ZipFile(bundled_path("pydocs")) as archive:
        assert archive.namelist() == ["lengths.npy"]
    with pytest.raises(UserError, match="unknown bundled dataset 'nope'"):
        bundled_path("nope")


def test_dataset_is_read_only_int64_and_a_value():
    dataset = load_dataset("pydocs")
    assert dataset.lengths.dtype == np.int64
    with pytest.raises(ValueError):
        dataset.lengths[0] = 5
    with pytest.raises(AttributeError):
        dataset.name = "x"  # type: ignore[misc]
    assert load_dataset("pydocs") == dataset
    source = np.array([3, 1, 2], dtype=np.int32)
    made = Dataset(name="m", lengths=source, source="test")
    source[0] = 99  # the dataset holds its own copy
    assert made.lengths.tolist() == [3, 1, 2] and made.stats.max == 3
    assert made != Dataset(name="m", lengths=np.array([3, 1, 1]), source="test")
    assert made.summary() == {"name": "m", "count": 3, "total_tokens": 6, "mean": 2.0, "median": 2.0,
                              "p99": pytest.approx(2.98), "max": 3, "share_tokens_over_32k": 0.0,
                              "source": "test"}


@pytest.mark.parametrize("lengths", [np.array([], dtype=np.int64), np.array([1, 0]),
                                     np.array([1.5]), np.ones((2, 2), dtype=np.int64)])
def test_dataset_rejects_bad_arrays(lengths):
    with pytest.raises(UserError, match="dataset 'bad'"):
        Dataset(name="bad", lengths=lengths, source="test")


def test_stats_by_hand():
    stats = dataset_stats(np.array([10, 20, 40000, 30]))
    assert stats.count == 4 and stats.total_tokens == 40060 and stats.max == 40000
    assert stats.mean == 10015.0 and stats.median == 25.0
    assert stats.p99 == pytest.approx(30 + 0.97 * (40000 - 30))  # linear interpolation
    assert stats.share_tokens_over_32k == 40000 / 40060
    # The threshold is strict: a document of exactly 32768 tokens is not "over 32K".
    assert dataset_stats(np.array([32768, 32769])).share_tokens_over_32k == 32769 / 65537


def test_load_dataset_from_paths(tmp_path):
    path = tmp_path / "wikipedia.txt"  # a file named like a bundled dataset is reachable by path
    path.write_text("4\n5\n")
    assert load_dataset(path).lengths.tolist() == [4, 5]
    assert load_dataset(str(path)).name == str(path)
    (tmp_path / "c.csv").write_text("a,b\n1,2\n3,4\n")
    dataset = load_dataset(tmp_path / "c.csv", column="b")
    assert dataset.lengths.tolist() == [2, 4] and "c.csv" in dataset.source


def test_unknown_name_lists_bundled_names():
    with pytest.raises(UserError) as info:
        load_dataset("wikipedai")
    message = str(info.value)
    assert "'wikipedai'" in message and all(name in message for name in PUBLISHED)


def test_synthetic_is_deterministic_and_shaped():
    config = SyntheticConfig(count=20_000, seed=7)
    first, second = synthetic_lengths(config), synthetic_lengths(config)
    assert np.array_equal(first, second) and first.dtype == np.int64
    assert not np.array_equal(first, synthetic_lengths(SyntheticConfig(count=20_000, seed=8)))
    assert first.min() >= 1 and first.max() <= config.max_length
    assert 0.9 * config.median < np.median(first) < 1.15 * config.median
    # The Pareto tail makes the top percentile far heavier than a lognormal alone would be.
    tail = np.sort(first)[-int(0.02 * config.count):]
    assert tail.min() >= 0.5 * config.tail_scale
    no_tail = synthetic_lengths(SyntheticConfig(count=20_000, seed=7, tail_share=0.0))
    assert first.sum() > no_tail.sum()


def test_synthetic_by_name():
    assert load_dataset("synthetic").stats.count == SyntheticConfig().count
    dataset = load_dataset("synthetic:count=500, seed=3,max_length=4096,tail_share=0.5")
    assert len(dataset) == 500 and dataset.stats.max <= 4096 and "seed 3" in dataset.source
    assert np.array_equal(dataset.lengths, synthetic_lengths(
        SyntheticConfig(count=500, seed=3, max_length=4096, tail_share=0.5)))
    with pytest.raises(UserError, match="bad parameter 'colour=red'"):
        load_dataset("synthetic:colour=red")
    with pytest.raises(UserError, match="count expects int, got 'many'"):
        load_dataset("synthetic:count=many")
    with pytest.raises(UserError, match="tail_share must be in"):
        load_dataset("synthetic:tail_share=2")
    with pytest.raises(UserError, match="seed must be a non-negative integer, got -1"):
        load_dataset("synthetic:seed=-1")
    with pytest.raises(UserError, match="median must be a finite length"):
        load_dataset("synthetic:median=inf")

