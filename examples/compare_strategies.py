"""Compare strategies on a bundled dataset with the protocol of ``slimpack compare``: warm-up steps,
then a measured window of consecutive steps, every strategy on the same batches.

Run: python examples/compare_strategies.py
"""

from slimpack import api

config = api.configure(model="llama2-7b", tp=8, pp=2, dp=2, max_context=32 * 1024,
                       global_batch_tokens=1024 * 1024)
data = api.dataset("pydocs")  # reStructuredText sources of the Python docs, Qwen3 tokens
print(f"{data.name}: {api.cut_at_context(data, config).describe()}")

comparison = api.compare(data, config, ["fixed", "kk", "slimpack"], warmup=1, steps=2)
for row in comparison.table():
    print(f"{row.strategy}: {row.tokens_per_s:,.0f} tokens/s, {row.speedup_vs_fixed:.3f}x fixed, "
          f"efficiency {row.efficiency:.4f}, {row.window_tokens} tokens in the window")
