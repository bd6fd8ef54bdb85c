"""Length data: loaders for length files, bundled real datasets, a synthetic generator, summary
statistics and the global-batch sampler (token budget, chunking at the context length).

Typical use::

    from slimpack.data import load_dataset, SamplerConfig, GlobalBatchSampler
    dataset = load_dataset("wikipedia")            # or a path, or "synthetic:seed=3"
    sampler = GlobalBatchSampler(dataset, SamplerConfig(global_batch_tokens=4 << 20,
                                                        max_context=64 << 10))
    batch = sampler.batch_at(0)                    # Batch of DocumentChunk(id, length, doc_index, chunk, ...)

Must not import torch.
"""

from slimpack.data.dataset import Dataset, bundled_datasets, bundled_path, load_dataset
from slimpack.data.loaders import SUFFIXES, load_lengths
from slimpack.data.sampler import (
    Batch,
    DocumentChunk,
    GlobalBatchSampler,
    SamplerConfig,
    sample_batches,
)
from slimpack.data.stats import (
    LONG_DOC_TOKENS,
    ContextCut,
    DatasetStats,
    context_cut,
    dataset_stats,
)
from slimpack.data.synthetic import SyntheticConfig, parse_synthetic, synthetic_lengths

__all__ = [
    "LONG_DOC_TOKENS", "SUFFIXES", "Batch", "ContextCut", "Dataset", "DatasetStats", "DocumentChunk",
    "GlobalBatchSampler", "SamplerConfig", "SyntheticConfig", "bundled_datasets", "bundled_path",
    "context_cut", "dataset_stats", "load_dataset", "load_lengths", "parse_synthetic", "sample_batches",
    "synthetic_lengths",
]
