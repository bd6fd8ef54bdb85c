"""Plans (the contract between planners, simulator and runtime) and the strategies that make them.

Must not import torch.
"""

from slimpack.plan.io import load_plan, plan_from_dict, plan_to_dict, save_plan
from slimpack.plan.types import Action, Group, PipelinePlan, Plan, Sample, Slice

__all__ = ["Action", "Group", "PipelinePlan", "Plan", "Sample", "Slice", "load_plan", "plan_from_dict",
           "plan_to_dict", "save_plan"]
