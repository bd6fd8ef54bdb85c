"""Use slimpack plans from other training frameworks.

- ``wholesample``: the whole-sample form of a plan (what frameworks that pack whole samples can run)
  and each data-parallel rank's micro-batches in it; no torch;
- ``hf``: padding-free packed batches for Hugging Face Transformers / TRL through a torch
  ``BatchSampler``/``DataLoader`` (imports torch; import it explicitly);
- ``megatron``: Megatron-Core's hybrid-context-parallel ``sample_id_groups`` and a drop-in for its
  ``BalancedCPScheduler``; no torch.

See docs/integrations.md.
"""

from slimpack.integrations.megatron import SlimpackCPScheduler, sample_id_groups
from slimpack.integrations.wholesample import (
    equal_count_form,
    is_whole_sample,
    rank_micro_batches,
    require_whole_sample,
    whole_sample_config,
    whole_sample_form,
)

__all__ = ["SlimpackCPScheduler", "equal_count_form", "is_whole_sample", "rank_micro_batches", "require_whole_sample",
           "sample_id_groups", "whole_sample_config", "whole_sample_form"]
