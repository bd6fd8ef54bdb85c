"""One rank's point-to-point transfers for one pipeline, posted in an order that cannot deadlock.

NCCL ignores tags: it matches the sends and receives between two ranks in the order they are
posted, and runs a rank's P2P operations one after another on a stream. Two neighbouring stages
that each post a send before the receive answering the other's send then wait for each other
forever, even though the schedule itself is deadlock-free (gloo, which buffers and matches by tag,
hides this).

So every rank posts its sends and receives in one global order: the order in which
``schedule.lowering.walk`` (a deadlock-free execution of the whole pipeline) runs the sends, each
transfer's sequence number. Following its own program, a rank posts every operation up to and
including the receive an action needs before running it, and up to and including the send it
produces right after. Two facts make that safe:

- a send is never posted before its tensor exists: a send ordered before a receive was produced,
  in the walk, before that receive's consumer, and the walk keeps each rank's program order;
- the earliest unfinished transfer is posted at both ends: its sender needs only earlier (so
  finished) transfers to produce it, and its receiver either waits on a later receive (so has
  posted everything up to it) or runs on until it needs it. Both ends' earlier operations are
  finished, so it completes; by induction, every transfer does.

The two ends of every link thus post the same sequence, on NCCL and gloo alike (gloo gets the
sequence number as the tag). Receive buffers are sized from the plan (tokens × hidden), so no
shape handshake is needed. A transfer between two chunks of the same rank (pp = 1 with virtual
stages) is handed over in memory.

Every wait (a receive, the completion of the sends) runs under the runtime's ``WaitMonitor``, which
names this rank, the transfer and the peer if it outlives the timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from slimpack.runtime.waits import WaitMonitor, fault_point
from slimpack.schedule.lowering import Transfer, Walk, link_order


class PeerFailure(RuntimeError):
    """Another rank died, hung, or failed: this rank cannot finish the step."""


class PipelineLinks:
    """The transfers of one pipeline that start or end on this rank's stage."""

    def __init__(self, run: Walk, *, stage: int, pp: int, rank_of_stage: Callable[[int], int],
                 rows: Callable[[Transfer], int], hidden: int, dtype: torch.dtype, device: torch.device,
                 monitor: WaitMonitor, what: str = "") -> None:
        """``what`` prefixes the monitor's action names (e.g. "step 3: ")."""
        self.sequence, self.stage, self.pp = run.transfers, stage, pp
        self.rank_of_stage, self.rows = rank_of_stage, rows
        self.hidden, self.dtype, self.device = hidden, dtype, device
        self.monitor, self.what = monitor, what
        self.rank = dist.get_rank()
        self.ops = link_order(run, stage, pp)
        self.index = {t: i for i, t in enumerate(self.ops)}
        self.posted = 0  # ops[:posted] are posted
        self.outbox: dict[Transfer, torch.Tensor] = {}  # computed, not yet posted
        self.inbox: dict[Transfer, tuple[dist.Work, torch.Tensor]] = {}  # posted receives
        self.sending: list[tuple[dist.Work, torch.Tensor, Transfer]] = []
        self.local: dict[Transfer, torch.Tensor] = {}
        self.wait_s = 0.0
        """Time spent blocked in receives."""

    def send(self, transfer: Transfer, tensor: torch.Tensor) -> None:
        if transfer.dst % self.pp == self.stage:
            self.local[transfer] = tensor
            return
        fault_point("send", self.rank)
        self.outbox[transfer] = tensor.contiguous()
        self._post_through(self.index[transfer])
        # drop sent tensors whose transfer has completed
        self.sending = [entry for entry in self.sending if not entry[0].is_completed()]

    def receive(self, transfer: Transfer) -> torch.Tensor:
        if transfer.src % self.pp == self.stage:
            return self.local.pop(transfer)
        self._post_through(self.index[transfer])
        work, buffer = self.inbox.pop(transfer)
        waited = time.perf_counter()
        self._wait(work, transfer, "receiving")
        self.wait_s += time.perf_counter() - waited
        return buffer

    def finish(self) -> None:
        """Wait for this rank's sends to complete."""
        for work, _, transfer in self.sending:
            self._wait(work, transfer, "sending")
        self.sending.clear()

    def _peer(self, transfer: Transfer) -> int:
        return self.rank_of_stage((transfer.dst if transfer.src % self.pp == self.stage else transfer.src) % self.pp)

    def _post_through(self, last: int) -> None:
        while self.posted <= last:
            transfer = self.ops[self.posted]
            tag = self.sequence[transfer]
            if transfer.src % self.pp == self.stage:
                tensor = self.outbox.pop(transfer)  # produced already (see the module docstring)
                self.sending.append((dist.isend(tensor, dst=self._peer(transfer), tag=tag), tensor, transfer))
            else:
                buffer = torch.empty((self.rows(transfer), self.hidden), dtype=self.dtype, device=self.device)
                self.inbox[transfer] = (dist.irecv(buffer, src=self._peer(transfer), tag=tag), buffer)
            self.posted += 1

    def _wait(self, work: dist.Work, transfer: Transfer, verb: str) -> None:
        peer = self._peer(transfer)
        what = f"{verb} {transfer.kind}{transfer.group} {'from' if verb == 'receiving' else 'to'} rank {peer}"
        try:
            with self.monitor.waiting(self.what + what, f"rank {peer}"):
                work.wait()
        except RuntimeError as exc:
            raise PeerFailure(f"rank {self.rank}: {what} failed (that rank died or timed out): "
                              f"{str(exc).splitlines()[0]}") from exc
