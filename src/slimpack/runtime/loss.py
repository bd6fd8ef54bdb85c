"""Token-level language-model loss, normalised by the global number of loss tokens.

Which positions carry loss: position p of a sample of length L predicts token p+1, so positions
0..L−2 carry loss and the last position of every sample carries none (a sample of length L has L−1
loss tokens; a one-token sample has none). A slice [a, b) therefore carries loss at its positions
p < L−1, with targets read from the sample's tokens (possibly from the next slice). The reference
uses the same rule, sample by sample.

The loss of a step is Σ cross-entropy over all loss tokens of the global batch divided by their
number (DESIGN.md §3), so a token's gradient is the same whatever group, slice or replica it runs
in: regrouping, slicing and packing cannot change the gradients.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from slimpack.runtime.tensor_parallel import local

IGNORE_INDEX = -100


def count_loss_tokens(lengths: Iterable[int]) -> int:
    """Loss tokens of samples of these lengths: Σ max(L − 1, 0)."""
    return sum(max(length - 1, 0) for length in lengths)


def slice_targets(tokens_l: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Targets of positions [start, end) of a sample: the next token, or IGNORE_INDEX at its end."""
    length = tokens_l.shape[0]
    targets_t = torch.full((end - start,), IGNORE_INDEX, dtype=torch.long, device=tokens_l.device)
    last = min(end, length - 1)  # positions [start, last) have a next token
    if last > start:
        targets_t[:last - start] = tokens_l[start + 1:last + 1]
    return targets_t


def token_losses(logits_tv: torch.Tensor, targets_t: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy (T,), zero where the target is IGNORE_INDEX.

    Vocabulary-sharded logits (a DTensor, tensor parallelism) need torch's ``loss_parallel`` context
    (``tensor_parallel.loss_context``); the result is then replicated and returned as a local tensor.
    Logits of a 16-bit model are upcast to float32 first, as mixed-precision training computes the
    loss (the softmax over the vocabulary and the loss sum keep float32 accuracy).
    """
    if logits_tv.dtype.itemsize < 4:
        logits_tv = logits_tv.float()
    return local(F.cross_entropy(logits_tv, targets_t, ignore_index=IGNORE_INDEX, reduction="none"))
