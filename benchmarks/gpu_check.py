"""One command for a GPU machine: the runtime's GPU numerics, slicing overhead, memory and calibration.

    PYTHONPATH=src python benchmarks/gpu_check.py [--out gpu_check.json]
        [--preset-dir src/slimpack/config/calibrated] [--parts numerics throughput memory calibrate]
        [--device cuda] [--repeats 5]

Parts (each prints its figures and its target; the JSON report holds them all):
1. ``numerics``: a sliced sample (K/V prefixes) through the executor in bf16 with the fused kernel
   (``auto``: flash-attn, else torch's varlen) against the float64 CPU reference (``reference_loss``);
   loss and every gradient, relative to the largest reference entry; bf16 tolerance ``BF16_TOLERANCE``.
2. ``throughput``: the same tokens unsliced and in slices (``runtime.throughput``); target: sliced
   throughput ≥ ``THROUGHPUT_TARGET`` of unsliced.
3. ``memory``: peak CUDA memory above weights and gradients while one stage runs a plan (all
   forwards, then all backwards), against the simulator's peak for the same plan minus its model
   states; target MAPE ≤ ``MEMORY_MAPE_TARGET`` over the plans. On the CPU the executor's own count of
   kept bytes (``ActivationTracker``) stands in for the allocator and is compared with the kept part.
4. ``calibrate``: ``runtime.calibrate.calibrate`` on the device in bf16; the fitted config is written
   to ``--preset-dir`` as ``<gpu>.json`` (usable as ``--config``) and its provenance (device, versions,
   commit, date, command) as ``<gpu>.provenance.json``.

Without a CUDA GPU it prints one line and exits with status 2, unless ``--device cpu`` asks for the
CPU-runnable parts at tiny sizes (the tests do that; the targets apply on a GPU only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from slimpack.config import ModelConfig, TrainConfig, build_config, model_preset
from slimpack.cost import CostModel
from slimpack.plan.types import Plan, Sample
from slimpack.runtime import build_executors, build_model, reference_loss, run_stage_orders
from slimpack.runtime.calibrate import calibrate
from slimpack.runtime.memory import ActivationTracker
from slimpack.runtime.pipeline import default_actions
from slimpack.runtime.throughput import slice_throughput, sliced_pipeline
from slimpack.runtime.verify import gradient_errors
from slimpack.sim import simulate

BF16_TOLERANCE = 3e-2
THROUGHPUT_TARGET = 0.97
MEMORY_MAPE_TARGET = 0.02
PARTS = ("numerics", "throughput", "memory", "calibrate")
ROOT = Path(__file__).resolve().parents[1]

# Llama-shaped, small enough for one GPU and for the float64 CPU reference (numerics part).
GPU_MODEL = ModelConfig(name="gpu-check-llama", num_layers=4, hidden=1024, num_heads=16, num_kv_heads=4,
                        ffn_hidden=2816, vocab_size=8192, dtype_bytes=2)
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {"model": GPU_MODEL, "dtype": torch.bfloat16, "numerics_tokens": 2048, "tokens": 16384,
             "slices": [1, 2, 4, 8], "memory_plans": [(4096, 1), (8192, 2), (16384, 4), (16384, 16)]},
    "cpu": {"model": model_preset("tiny"), "dtype": torch.float32, "numerics_tokens": 96, "tokens": 128,
            "slices": [1, 4], "memory_plans": [(64, 1), (128, 4)]},
}


def verdict(ok: bool, device: torch.device) -> str:
    """The targets are for a GPU; tiny CPU runs only exercise the code."""
    return ("pass" if ok else "FAIL") if device.type == "cuda" else "(the target is for a GPU)"


def one_stage_plan(model: ModelConfig, tokens: int, slices: int) -> Plan:
    """One sample of ``tokens`` in ``slices`` slices on one stage, all forwards then all backwards."""
    config = build_config(model=model, train=TrainConfig(recompute="none", max_context=tokens,
                                                         global_batch_tokens=tokens))
    pipe = sliced_pipeline(tokens, slices)
    pipe = type(pipe)(replicas=pipe.replicas, cp=pipe.cp, forward=pipe.forward, backward=pipe.backward,
                      order=(tuple(default_actions(pipe)),))
    return Plan(config=config, strategy="gpu-check", samples=(Sample(id=0, length=tokens),), pipelines=(pipe,))


def check_numerics(sizes: dict[str, Any], device: torch.device) -> dict[str, Any]:
    model, tokens = sizes["model"], sizes["numerics_tokens"]
    ids = torch.randint(0, model.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0))
    reference = build_model(model, seed=0, dtype=torch.float64)
    ref_loss = float(reference_loss(reference, {0: ids}))
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    net = build_model(model, seed=0, dtype=sizes["dtype"], device=device)
    plan = one_stage_plan(model, tokens, 4)
    pipe = plan.pipelines[0]
    executors = build_executors(net, pipe, num_chunks=1, sample_lengths={0: tokens}, tokens={0: ids.to(device)},
                                num_loss_tokens=tokens - 1)
    loss = float(run_stage_orders(executors, pipe.order))
    errors = gradient_errors({n: p.grad.double().cpu() for n, p in net.named_parameters()}, ref_grads)
    worst = max(errors, key=lambda e: e.relative)
    result = {"backend": executors[0].backend, "dtype": str(sizes["dtype"]), "tokens": tokens, "slices": 4,
              "loss": loss, "reference_loss": ref_loss, "loss_relative": abs(loss - ref_loss) / abs(ref_loss),
              "max_gradient_relative": worst.relative, "worst_parameter": worst.name, "tolerance": BF16_TOLERANCE}
    result["pass"] = max(result["loss_relative"], worst.relative) <= BF16_TOLERANCE
    print(f"numerics ({result['backend']}, {result['dtype']}, {tokens} tokens in 4 slices vs float64 CPU reference): "
          f"loss {result['loss_relative']:.2e}, gradients max {worst.relative:.2e} ({worst.name}); "
          f"tolerance {BF16_TOLERANCE:g}: {verdict(result['pass'], device)}")
    return result


def check_throughput(sizes: dict[str, Any], device: torch.device, repeats: int) -> dict[str, Any]:
    net = build_model(sizes["model"], seed=0, dtype=sizes["dtype"], device=device)
    rows = slice_throughput(net, sizes["tokens"], sizes["slices"], backend="auto", repeats=repeats)
    worst = min(r.relative for r in rows)
    for r in rows:
        print(f"throughput: {sizes['tokens']} tokens in {r.slices:>2} slice(s): {r.tokens_per_s:,.0f} tokens/s, "
              f"{r.relative:.3f} of unsliced")
    print(f"throughput: worst {worst:.3f} of unsliced; target >= {THROUGHPUT_TARGET}: "
          f"{verdict(worst >= THROUGHPUT_TARGET, device)}")
    return {"tokens": sizes["tokens"], "rows": [{"slices": r.slices, "tokens_per_s": r.tokens_per_s,
                                                  "relative": r.relative} for r in rows],
            "worst_relative": worst, "target": THROUGHPUT_TARGET, "pass": worst >= THROUGHPUT_TARGET}


def measure_plan_memory(plan: Plan, dtype: torch.dtype, device: torch.device) -> int:
    """Bytes above weights and gradients at the peak of running ``plan``'s one stage (CUDA: the
    allocator's peak; CPU: the executor's kept bytes, ``ActivationTracker``)."""
    pipe, tokens = plan.pipelines[0], plan.samples[0].length
    net = build_model(plan.config.model, seed=0, dtype=dtype, device=device)
    for p in net.parameters():  # gradients are model state, allocated before the baseline
        p.grad = torch.zeros_like(p)
    ids = torch.randint(0, plan.config.model.vocab_size, (tokens,), device=device)
    executors = build_executors(net, pipe, num_chunks=1, sample_lengths={0: tokens}, tokens={0: ids},
                                num_loss_tokens=tokens - 1, track_memory=device.type == "cpu")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run_stage_orders(executors, pipe.order)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - baseline
    run_stage_orders(executors, pipe.order)
    tracker = executors[0].tracker
    assert isinstance(tracker, ActivationTracker)
    return tracker.peak_bytes


def check_memory(sizes: dict[str, Any], device: torch.device) -> dict[str, Any]:
    rows = []
    for tokens, slices in sizes["memory_plans"]:
        plan = one_stage_plan(sizes["model"], tokens, slices)
        cost = CostModel(plan.config)
        simulated = simulate(plan, cost, check=False).peak_memory_bytes[0] - cost.model_state_bytes(0)
        # the allocator sees everything the simulator counts; the CPU tracker sees only kept bytes
        predicted = simulated if device.type == "cuda" else cost.activation_bytes(tokens, virtual_stage=0)
        measured = measure_plan_memory(plan, sizes["dtype"], device)
        rows.append({"tokens": tokens, "slices": slices, "measured_bytes": measured, "predicted_bytes": predicted,
                     "error": measured / predicted - 1})
        print(f"memory: {tokens} tokens in {slices} slice(s): measured {measured / 2**20:,.1f} MiB, predicted "
              f"{predicted / 2**20:,.1f} MiB ({rows[-1]['error']:+.2%})")
    mape = sum(abs(r["error"]) for r in rows) / len(rows)
    print(f"memory: MAPE {mape:.2%}; target <= {MEMORY_MAPE_TARGET:.0%}: {verdict(mape <= MEMORY_MAPE_TARGET, device)}")
    return {"rows": rows, "mape": mape, "target": MEMORY_MAPE_TARGET, "pass": mape <= MEMORY_MAPE_TARGET,
            "measure": "cuda allocator peak" if device.type == "cuda" else "ActivationTracker kept bytes"}


def provenance(device: torch.device, argv: list[str]) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    versions = {"torch": torch.__version__, "python": platform.python_version(), "cuda": torch.version.cuda}
    try:
        from importlib.metadata import version

        versions["flash_attn"] = version("flash_attn")
    except Exception:  # noqa: BLE001 - not installed
        versions["flash_attn"] = None
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "versions": versions, "commit": commit.stdout.strip() or None,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python", "benchmarks/gpu_check.py", *argv])}


def run_calibration(sizes: dict[str, Any], device: torch.device, repeats: int, preset_dir: Path,
                    argv: list[str]) -> dict[str, Any]:
    base = build_config(model=sizes["model"])
    result = calibrate(base, dtype=sizes["dtype"], device=device, repeats=repeats,
                       say=lambda line: print(f"calibrate: {line}", flush=True))
    origin = provenance(device, argv)
    name = origin["device"].lower().replace(" ", "-")
    preset_dir.mkdir(parents=True, exist_ok=True)
    path = preset_dir / f"{name}.json"
    path.write_text(json.dumps(result.config.to_dict(), indent=2) + "\n")
    # beside the config, not in it: a config file holds only config sections
    path.with_suffix(".provenance.json").write_text(json.dumps(origin, indent=2) + "\n")
    eff = result.config.efficiency
    print(f"calibrate: op fit MAPE {result.ops.mape:.1%}; gemm_max {eff.gemm_max:.3f}, attention_max "
          f"{eff.attention_max:.3f}, layer overhead {eff.layer_overhead_s * 1e6:.0f} us -> {path}")
    return {"preset": str(path), "op_fit_mape": result.ops.mape, "peak_flops": result.peak_flops,
            "bandwidth": result.bandwidth, "provenance": origin}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--out", default="gpu_check.json", help="JSON report (default gpu_check.json)")
    parser.add_argument("--preset-dir", default=str(ROOT / "src/slimpack/config/calibrated"),
                        help="where calibrate writes <gpu>.json")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: this machine has no CUDA GPU (or torch is a CPU build): nothing was measured; run it on a "
              "GPU machine, or with --device cpu for the CPU-runnable parts at tiny sizes", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # CPU timings are process CPU time (runtime.throughput)
    sizes = SIZES[args.device]
    report: dict[str, Any] = {"device": str(device), "model": sizes["model"].name}
    if "numerics" in args.parts:
        report["numerics"] = check_numerics(sizes, device)
    if "throughput" in args.parts:
        report["throughput"] = check_throughput(sizes, device, args.repeats)
    if "memory" in args.parts:
        report["memory"] = check_memory(sizes, device)
    if "calibrate" in args.parts:
        report["calibrate"] = run_calibration(sizes, device, args.repeats, Path(args.preset_dir), argv)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
