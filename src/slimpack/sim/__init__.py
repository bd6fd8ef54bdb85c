"""The DAG simulator: time, memory and metrics of a Plan's step; Chrome traces; plots in
``slimpack.sim.plots`` (imported on demand: it loads matplotlib). No torch."""

from slimpack.sim.result import DeviceMemory, SimResult, Span
from slimpack.sim.simulate import (
    pipelines_step_and_peak,
    pipelines_step_time,
    simulate,
    step_and_peak,
    step_time,
)
from slimpack.sim.trace import chrome_trace, save_chrome_trace

__all__ = ["DeviceMemory", "SimResult", "Span", "chrome_trace", "pipelines_step_and_peak", "pipelines_step_time", "save_chrome_trace", "simulate", "step_and_peak", "step_time"]
