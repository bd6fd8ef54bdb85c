"""Plan one global batch of document lengths with two strategies, simulate both, keep the faster plan.

Run: python examples/plan_a_batch.py [plan.json]
"""

import sys

from slimpack import api

# Llama-2-7B on 64 simulated H100s (tp 8 x pp 4 x dp 2), 32K context.
config = api.configure(model="llama2-7b", gpu="h100-sxm", tp=8, pp=4, dp=2, max_context=32 * 1024,
                       global_batch_tokens=256 * 1024)
# A long-tailed batch: a few long documents among many short ones (tokens per document).
lengths = [30_000, 22_000, 16_384, 9_000, 6_000, 4_000, 3_000] + [1_500] * 12 + [600] * 40

best = None
for strategy in ("kk", "slimpack"):
    plan = api.plan_batch(lengths, config, strategy)
    result = api.simulate(plan)
    print(f"{strategy}: step {result.step_time_s:.6f} s, ideal {result.ideal_time_s:.6f} s, "
          f"efficiency {result.efficiency:.4f}, {result.tokens_per_s:,.0f} tokens/s")
    if best is None or result.step_time_s < best[1].step_time_s:
        best = (plan, result)

path = sys.argv[1] if len(sys.argv) > 1 else "plan.json"
api.save_plan(best[0], path)
again = api.load_plan(path)
api.check_plan(again)  # a plan file is self-contained: coverage and order check from the file alone
print(f"faster: {best[0].strategy}; wrote {path}; reloaded step time {api.simulate(again).step_time_s:.6f} s")
