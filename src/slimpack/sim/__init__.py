"""The DAG simulator: time, memory and metrics of a Plan's step; traces and plots. No torch."""

from slimpack.sim.result import DeviceMemory, SimResult, Span
from slimpack.sim.simulate import simulate

__all__ = ["DeviceMemory", "SimResult", "Span", "simulate"]
