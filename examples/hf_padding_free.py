"""Padding-free micro-batches for Hugging Face Transformers / TRL from slimpack plans (needs torch).

Each data-parallel rank builds the same plans and takes its own micro-batches: packed rows with
``position_ids`` and ``cu_seq_lens`` (the keys of transformers' DataCollatorWithFlattening), every
rank with the same number of micro-batches per step. Feed them to a model that runs
FlashAttention, or to sdpa/eager with ``model.config.use_cache = False`` (see docs/integrations.md).

Run: python examples/hf_padding_free.py
"""

import random

from slimpack import api
from slimpack.integrations.hf import plan_data_loader

# A tokenized dataset: rows holding input_ids (here random tokens of long-tailed lengths).
rng = random.Random(0)
rows = [{"input_ids": [rng.randrange(1000) for _ in range(int(rng.paretovariate(1.2) * 40))]} for _ in range(400)]

# The tiny model on 2 data-parallel ranks, 512-token context, 4K-token global batches.
config = api.configure(model="tiny", dp=2, max_context=512, global_batch_tokens=4096)
for rank in (0, 1):
    loader = plan_data_loader(rows, config, rank=rank, num_steps=2, strategy="slimpack")
    sampler = loader.batch_sampler
    print(f"rank {rank}: micro-batches per step {sampler.micro_batches_per_step}, "
          f"loss tokens of step 0 (all ranks) {sampler.loss_tokens(0)}")
    for index, batch in enumerate(loader):
        cu = batch["cu_seq_lens_q"].tolist()
        print(f"rank {rank} micro-batch {index}: {batch['input_ids'].shape[1]} tokens, "
              f"{len(cu) - 1} samples, cu_seq_lens {cu}")
