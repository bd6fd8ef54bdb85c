"""Which device a command may run on, and whether a model fits there: checked before any work, so
a bad ``--device`` or an oversized model is one line, not a late traceback or a machine out of memory."""

from __future__ import annotations

import os

import torch

from slimpack.errors import UserError
from slimpack.units import GIB


def usable_device(text: str) -> torch.device:
    """``text`` as a torch device this process can use: the CPU, or a CUDA device that exists."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UserError(f"--device {text!r} is not a torch device (try cpu or cuda)") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise UserError(f"--device {text}: the runtime runs on cpu or cuda")
    if not torch.cuda.is_available():
        raise UserError(f"--device {text}: this torch sees no CUDA device (a CPU-only build, or no GPU)")
    if (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device {text}: there are {torch.cuda.device_count()} CUDA device(s)")
    return device


def free_memory_bytes(device: torch.device) -> int:
    """Memory this process could still allocate on ``device`` (physical RAM for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:  # Linux: free memory plus what the kernel would give back (page cache), as `free` shows
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_fits(num_bytes: float, device: torch.device, what: str) -> None:
    """Refuse ``what`` when it needs more than the memory ``device`` has free."""
    free = free_memory_bytes(device)
    if num_bytes > free:
        raise UserError(f"{what} needs about {num_bytes / GIB:.1f} GiB, more than the {free / GIB:.1f} GiB free on "
                        f"{device}: use a smaller --model (e.g. tiny) or --force")
