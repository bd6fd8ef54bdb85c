"""The SlimPack planner: slicing, MicroPacks, asymmetric backward groups, DP-aware phases, DP-Merge."""

from slimpack.strategies.slimpack.planner import SlimPackPlanner

__all__ = ["SlimPackPlanner"]
