import numpy as np
import pytest

from slimpack.config import EfficiencyConfig, model_preset
from slimpack.cost.calibrate import (
    TimingRecord,
    fit_efficiency,
    load_calibration,
    load_records,
    predict,
    save_calibration,
    save_records,
)
from slimpack.errors import UserError

TINY_PEAK = 1e12


def _records(truth: EfficiencyConfig, noise: float = 0.0, seed: int = 0) -> list[TimingRecord]:
    model = model_preset("llama2-7b")
    rng = np.random.default_rng(seed)
    records = []
    for tokens in (128, 512, 2048, 8192):
        for op, prefix in (("gemm", 0), ("attention", 0), ("attention", 4 * tokens), ("layer", tokens)):
            r = TimingRecord(op=op, tokens=(tokens,), prefix=(prefix,), time_s=1.0)
            t = predict(r, model, TINY_PEAK, truth) * (1 + noise * rng.standard_normal())
            records.append(TimingRecord(op=op, tokens=(tokens,), prefix=(prefix,), time_s=t))
    return records


def test_fit_recovers_known_parameters():
    truth = EfficiencyConfig(gemm_max=0.6, gemm_half_tokens=300, attention_max=0.4,
                             attention_half_tokens=700, layer_overhead_s=2e-4)
    result = fit_efficiency(_records(truth), model_preset("llama2-7b"), TINY_PEAK)
    for name in ("gemm_max", "gemm_half_tokens", "attention_max", "attention_half_tokens", "layer_overhead_s"):
        assert getattr(result.efficiency, name) == pytest.approx(getattr(truth, name), rel=1e-6)
    assert result.mape < 1e-9


def test_fit_with_noise_reports_its_error(tmp_path):
    truth = EfficiencyConfig(gemm_max=0.7, attention_max=0.5)
    records = _records(truth, noise=0.03, seed=1)
    result = fit_efficiency(records, model_preset("llama2-7b"), TINY_PEAK)
    assert 0.003 < result.mape < 0.08
    assert result.efficiency.gemm_max == pytest.approx(0.7, rel=0.1)
    save_records(records, tmp_path / "r.json")
    assert load_records(tmp_path / "r.json") == records
    save_calibration(result, tmp_path / "c.json")
    assert load_calibration(tmp_path / "c.json") == result.efficiency


def test_bad_records_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="at least one"):
        fit_efficiency([], model_preset("tiny"), TINY_PEAK)
    with pytest.raises(UserError, match="non-positive"):
        fit_efficiency([TimingRecord(op="gemm", tokens=(0,), prefix=(0,), time_s=1.0)], model_preset("tiny"), 1e12)
    (tmp_path / "bad.json").write_text("[{}]")
    with pytest.raises(UserError, match="cannot read timing records"):
        load_records(tmp_path / "bad.json")
