"""Named presets: model shapes from the published configs, GPUs from NVIDIA datasheets.

Model shapes: Llama 2 (Touvron et al., 2023, Table 1 and the released config.json files), Llama 3
and Llama 3.2 (Meta's released config.json), Qwen2.5 (Qwen team, 2024, Table 1 / config.json). The
small Llama 3.2 and Qwen2.5 models tie their LM head to the input embedding.

GPU figures (dense bf16, i.e. without 2:4 sparsity; link speeds per direction):
- H100 SXM5: 989.4 TFLOP/s, 80 GB HBM3 (nvidia-smi: 81559 MiB), 3.35 TB/s, NVLink 4 900 GB/s
  bidirectional = 450 GB/s per direction, one 400 Gb/s NDR NIC per GPU = 50 GB/s
  (NVIDIA H100 Tensor Core GPU datasheet; DGX H100 user guide).
- H200 SXM: 989.4 TFLOP/s, 141 GB HBM3e (nvidia-smi: 143771 MiB), 4.8 TB/s, NVLink 900 GB/s,
  400 Gb/s NDR per GPU (NVIDIA H200 datasheet; DGX H200).
- A100 80GB SXM4: 312 TFLOP/s, 80 GB HBM2e (81920 MiB), 2.039 TB/s, NVLink 3 600 GB/s bidirectional
  = 300 GB/s per direction, one 200 Gb/s HDR NIC per GPU = 25 GB/s (NVIDIA A100 datasheet; DGX A100).
"""

from __future__ import annotations

from typing import Any

from slimpack.config.cluster import ClusterConfig
from slimpack.config.model import ModelConfig
from slimpack.errors import UserError

MIB = 2**20

MODEL_PRESETS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        ModelConfig(name="llama2-7b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=32,
                    ffn_hidden=11008, vocab_size=32000),
        ModelConfig(name="llama2-13b", num_layers=40, hidden=5120, num_heads=40, num_kv_heads=40,
                    ffn_hidden=13824, vocab_size=32000),
        ModelConfig(name="llama2-70b", num_layers=80, hidden=8192, num_heads=64, num_kv_heads=8,
                    ffn_hidden=28672, vocab_size=32000),
        ModelConfig(name="llama3-8b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=8,
                    ffn_hidden=14336, vocab_size=128256),
        ModelConfig(name="llama3-70b", num_layers=80, hidden=8192, num_heads=64, num_kv_heads=8,
                    ffn_hidden=28672, vocab_size=128256),
        ModelConfig(name="llama3.2-1b", num_layers=16, hidden=2048, num_heads=32, num_kv_heads=8,
                    ffn_hidden=8192, vocab_size=128256, tie_embeddings=True),
        ModelConfig(name="llama3.2-3b", num_layers=28, hidden=3072, num_heads=24, num_kv_heads=8,
                    ffn_hidden=8192, vocab_size=128256, tie_embeddings=True),
        ModelConfig(name="qwen2.5-1.5b", num_layers=28, hidden=1536, num_heads=12, num_kv_heads=2,
                    ffn_hidden=8960, vocab_size=151936, tie_embeddings=True),
        ModelConfig(name="qwen2.5-3b", num_layers=36, hidden=2048, num_heads=16, num_kv_heads=2,
                    ffn_hidden=11008, vocab_size=151936, tie_embeddings=True),
        ModelConfig(name="qwen2.5-7b", num_layers=28, hidden=3584, num_heads=28, num_kv_heads=4,
                    ffn_hidden=18944, vocab_size=152064),
        ModelConfig(name="qwen2.5-32b", num_layers=64, hidden=5120, num_heads=40, num_kv_heads=8,
                    ffn_hidden=27648, vocab_size=152064),
        ModelConfig(name="qwen2.5-72b", num_layers=80, hidden=8192, num_heads=64, num_kv_heads=8,
                    ffn_hidden=29568, vocab_size=152064),
        # A model small enough for CPU runtime tests: byte-level vocabulary, GQA, SwiGLU.
        ModelConfig(name="tiny", num_layers=4, hidden=64, num_heads=4, num_kv_heads=2,
                    ffn_hidden=176, vocab_size=256, dtype_bytes=4),
    )
}

CLUSTER_PRESETS: dict[str, ClusterConfig] = {
    c.name: c
    for c in (
        ClusterConfig(name="h100-sxm", peak_flops=989.4e12, memory_bytes=81559 * MIB,
                      hbm_bandwidth=3.35e12, gpus_per_node=8, intra_node_bandwidth=450e9,
                      inter_node_bandwidth=50e9),
        ClusterConfig(name="h200", peak_flops=989.4e12, memory_bytes=143771 * MIB,
                      hbm_bandwidth=4.8e12, gpus_per_node=8, intra_node_bandwidth=450e9,
                      inter_node_bandwidth=50e9),
        ClusterConfig(name="a100-80g", peak_flops=312e12, memory_bytes=81920 * MIB,
                      hbm_bandwidth=2.039e12, gpus_per_node=8, intra_node_bandwidth=300e9,
                      inter_node_bandwidth=25e9),
    )
}


def _lookup(table: dict[str, Any], name: str, what: str) -> Any:
    try:
        return table[name]
    except KeyError:
        raise UserError(f"unknown {what} {name!r}; valid: {', '.join(sorted(table))}") from None


def model_preset(name: str) -> ModelConfig:
    return _lookup(MODEL_PRESETS, name, "model")


def cluster_preset(name: str) -> ClusterConfig:
    return _lookup(CLUSTER_PRESETS, name, "gpu")
