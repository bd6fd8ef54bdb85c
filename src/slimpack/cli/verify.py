"""``slimpack verify``: run a plan sliced and packed through the PyTorch runtime and compare the loss
and every gradient with ordinary unsliced training of the same samples (``slimpack.runtime.verify``).

Exit 0 when the loss and all gradients agree within the tolerance, 1 when they do not (or the plan
cannot be executed), 2 for a usage error. Imports torch only when it runs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from slimpack.cli.common import positive_float, positive_int
from slimpack.config.defaults import PRECISIONS
from slimpack.errors import InvalidPlanError, UserError

if TYPE_CHECKING:
    import torch

    from slimpack.config import ModelConfig
    from slimpack.plan import Plan
    from slimpack.runtime.verify import VerifyResult

HELP = "check a plan's numerics: loss and gradients of its sliced, packed execution vs unsliced training"

DEFAULT_MAX_TOKENS = 64 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, metavar="FILE", help="plan file (JSON) to verify")
    parser.add_argument("--dtype", choices=("float64", "float32"),
                        help="precision of the weights and the check (default float64; float32 with --precision bf16)")
    parser.add_argument("--precision", choices=PRECISIONS, default="full",
                        help="full: compute in --dtype; bf16: bf16 compute with float32 master weights and "
                             "gradients, checked against the float32 run (default full)")
    parser.add_argument("--model", default="tiny", metavar="M",
                        help="model preset or a Hugging Face config.json (runs transformers' model, needs "
                             "slimpack[hf]) for the numerics (default tiny); the plan's sample lengths are kept")
    parser.add_argument("--seed", type=int, default=0, help="seed for the weights and the random tokens")
    parser.add_argument("--tolerance", type=positive_float, metavar="X",
                        help="largest relative error accepted (default 1e-10 for float64, 1e-6 for float64 with a "
                             "config.json: transformers' RMSNorm rounds to float32; 1e-5 for float32; 5e-2 "
                             "for bf16)")
    parser.add_argument("--backend", choices=("auto", "math", "cpu", "flash", "torch"), default="auto",
                        help="attention backend (default auto: the fastest usable on the device)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu or cuda[:N] (default cpu)")
    parser.add_argument("--max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS, metavar="N",
                        help="refuse plans with more tokens than this on a CPU unless --force (default 64K)")
    parser.add_argument("--force", action="store_true",
                        help="verify however many tokens the plan has, whatever the model's size")
    parser.add_argument("--ignore-order", action="store_true",
                        help="run all forwards then all backwards even where the plan gives a per-stage order")


def run(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError("slimpack verify needs PyTorch: install slimpack[torch]") from None
    from slimpack.runtime.verify import verify_plan

    plan, model, dtype, device, tolerance = _checked_inputs(args)
    try:
        result = verify_plan(plan, model=args.model, dtype=dtype, seed=args.seed, backend=args.backend,
                             device=device, use_order=not args.ignore_order, precision=args.precision)
    except ValueError as exc:  # a ScheduleError too: the order cannot run
        if isinstance(exc, UserError) and not isinstance(exc, InvalidPlanError):
            raise  # a bad --model, e.g. a checkpoint the plan's stages cannot split: exit 2
        print(f"slimpack verify: FAILED, the plan cannot be executed: {exc}")
        return 1
    _report(args, plan, result, tolerance)
    return 0 if result.passed(tolerance) else 1


def _checked_inputs(args: argparse.Namespace) -> tuple[Plan, ModelConfig, torch.dtype, torch.device, float]:
    """The plan, model, dtype, device and tolerance, or one clear error before any work."""
    import torch

    from slimpack.plan import load_plan
    from slimpack.runtime.attention import resolve_backend
    from slimpack.runtime.device import check_fits, usable_device
    from slimpack.runtime.verify import default_tolerance, numerics_model, plan_lengths

    device = usable_device(args.device)
    if args.precision == "bf16" and args.dtype == "float64":
        raise UserError("--precision bf16 keeps float32 master weights: leave out --dtype or pass float32")
    dtype_name = args.dtype or ("float32" if args.precision == "bf16" else "float64")
    dtype = torch.float64 if dtype_name == "float64" else torch.float32
    try:
        resolve_backend(args.backend, device, torch.bfloat16 if args.precision == "bf16" else dtype)
    except ValueError as exc:
        raise UserError(f"--backend: {exc}") from None
    plan = load_plan(args.plan)
    try:
        lengths = plan_lengths(plan)
    except ValueError as exc:
        raise UserError(f"{args.plan}: {exc}") from None
    total = sum(lengths.values())
    if device.type == "cpu" and total > args.max_tokens and not args.force:
        raise UserError(f"{args.plan} runs {total} tokens in {len(lengths)} samples, more than {args.max_tokens} "
                        f"is slow on a CPU (sample lengths are never scaled down); pass --force to run it anyway")
    par = plan.config.parallel
    model = numerics_model(args.model, par.pp * par.virtual_stages, par.stage_layers)
    if not args.force:  # weights and two sets of gradients (packed run, reference run)
        check_fits(3 * model.num_params() * dtype.itemsize, device, f"model {model.name} in {dtype_name}")
    default = default_tolerance(args.model, dtype, args.precision)
    tolerance = args.tolerance if args.tolerance is not None else default
    return plan, model, dtype, device, tolerance


def _report(args: argparse.Namespace, plan: Plan, result: VerifyResult, tolerance: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 110)  # keep parameter names whole in logs
    m = result.model
    console.print(f"plan {args.plan}: strategy {plan.strategy}, {result.num_samples} samples, "
                  f"{result.num_tokens} tokens, {result.num_slices} slices, {result.num_pipelines} pipeline(s) "
                  f"({result.asymmetric_pipelines} asymmetric, {result.ordered_pipelines} run in the plan's order)")
    console.print(f"numerics: model {m.name} ({m.num_layers} layers, hidden {m.hidden}, {m.num_heads}/"
                  f"{m.num_kv_heads} heads, {m.ffn_kind}) in {result.dtype}, {plan.config.parallel.pp} stage(s) "
                  f"x {plan.config.parallel.virtual_stages} chunk(s), seed {args.seed}")
    table = Table(title="gradient error per parameter: max|g - g_ref| / max|g_ref|")
    table.add_column("parameter", no_wrap=True)
    for column in ("elements", "max |g_ref|", "max |g - g_ref|", "relative", ""):
        table.add_column(column, justify="right")
    for p in result.params:
        ok = result.param_error(p) <= result.grad_tolerance(tolerance)
        table.add_row(p.name, str(p.numel), f"{p.max_abs_reference:.3e}", f"{p.max_abs_error:.3e}",
                      f"{result.param_error(p):.2e}", "ok" if ok else "[bold red]FAIL[/]")
    console.print(table)
    console.print(f"loss {result.loss:.15g} vs reference {result.reference_loss:.15g}: relative difference "
                  f"{result.loss_error:.2e}")
    if result.precision != "full":
        console.print(f"{result.precision} compute: gradient errors are relative L2 norms; the unsliced "
                      f"{result.precision} run's worst is {result.baseline_grad_error:.2e}")
    verdict = "[bold green]PASSED[/]" if result.passed(tolerance) else "[bold red]FAILED[/]"
    console.print(f"{verdict}: worst gradient error {result.max_grad_error:.2e}, loss error "
                  f"{result.loss_error:.2e} (tolerance {tolerance:.0e})")
