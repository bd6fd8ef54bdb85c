"""``tune``: the best layout of each strategy on a GPU budget, by branch and bound over layouts,
then a confirmation of the front runners over the comparison protocol's window.

Screening, per strategy: every layout the budget allows (``layouts``) that passes the memory floor
is given its time floor (``bounds``); layouts are screened (one step by default) in order of
rising floor, and once a layout's floor says it cannot beat the best screened so far, it and all
after it are pruned. A screened plan out of memory is found from its groups and order before it is
simulated (``trials.plan_out_of_memory``). Because the floors are true lower bounds, the best
screened is the best exhaustive screening would find (``exhaustive=True`` simulates everything,
with no floor and no memory check, for tests).

With several workers, trials run in worker processes, the strategies' searches side by side; a
worker with nothing due screens ahead (the next layout of a search whose frontier is still
running). A layout screened ahead that the in-order search prunes is recorded as pruned and its
figures dropped, so the trials, their statuses and the best are the same with any number of
workers (only the CPU time spent differs: ``TuneResult.ahead_discarded`` counts such trials).

Confirmation (DESIGN.md §3, comparison protocol), in rounds: a strategy's screened layouts within
``confirm_within`` of its best (``DEFERRING_CONFIRM_WITHIN`` for a strategy that defers samples),
at most ``confirm`` per micro-batch cap, are re-run over ``window`` (warm-up steps, then the
measured window with deferred work carried), and the best on the window's tokens/s wins. A layout
that fails the window (out of memory, or a failed schedule) leaves the running: its screened figure
no longer prunes, so the layouts it pruned are screened after all (their floors may beat the best
that remains), and the next round confirms the front runners of what is left. Without this, a
screened best that runs out of memory later in the window would hide every layout its figure
pruned (WLB-LLM at textbooks 128K on 64 GPUs: its screened best, ``tp1 pp1 dp64``, runs out of
memory once its queues release the long documents).

A time limit (``time_limit_s``, ``--time-limit``) makes the search an anytime one that ends about
then. Screening gets at least ``SCREEN_AT_LEAST`` of it; after that no new layout is screened once
what is left is what giving every strategy one window figure would take (``confirm_reserve_s``); a
strategy with none simulated yet goes on until one does. The layouts left are told ``NOT_SCREENED``
with their floors. Each strategy's best front runner is confirmed whatever the time; the others
only where their windows are estimated to end within the limit, and those left out are reported
(``StrategyTuning.unconfirmed``). The floors make the cut honest: no layout left unscreened can
screen faster than the screened tokens over its floor (``StrategyTuning.unscreened_ceiling``), which
the summary prints beside the best screened figure. Under a limit a search screens its most
promising layout first, not its frontier (``_Search._promise``: the ceiling scaled by how close to
their ceilings the layouts of the same tp have screened), and idle workers go first to the search
whose best could still rise the most by its floors (``_Search.headroom``), so the limit is spent
where it can matter. Pruning still goes by the floors, against the best screened in or out of
order, so the best screened is the exact search's whenever the limit lets screening finish; the
search without a limit keeps the floor order, the cheapest exact one. With a limit, layouts met
before the best was known may be screened although the exact search prunes them, so a limit not
reached can still confirm other front runners (the summary says how many layouts each screened).
Must not import torch.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

from slimpack.compare.run import Window, check_strategies
from slimpack.config import Config
from slimpack.config.cluster import MOST_GPUS
from slimpack.cost import CostModel
from slimpack.data import Dataset
from slimpack.errors import UserError
from slimpack.plan.types import Sample
from slimpack.strategies import DEFERS_SAMPLES, MICRO_BATCH_CAPPED
from slimpack.strategies.micro_batches import micro_batch_caps
from slimpack.strategies.stream import stream_batches
from slimpack.tune.bounds import memory_floor_bytes, time_floor_s
from slimpack.tune.layouts import Layout, layouts
from slimpack.tune.trials import Task, Trial, Trials, reason

PRUNED_BY_BOUND = "pruned: its time floor cannot beat the best simulated layout"
PRUNED_BY_MEMORY = "pruned: model states plus the longest sample's activations exceed GPU memory"
NOT_SCREENED = "not screened: the time limit left no time to screen it"
CONFIRM = 5
"""Front runners per strategy confirmed over the window, at most (per micro-batch cap). One step
ranks layouts within a few percent only roughly: over the 30 best-vs-best tables of ``docs/tune``
with three (nineteenth session), the window picked the third-screened in 21 of the 138 searches
that confirmed three, and a fourth found 1.8-6.1% more in two cells. With four (twentieth and
twenty-first sessions), interleaved layouts that screened higher once SlimPack planned them better
pushed its best layout at wikipedia 64K to fifth on both sizes: on step 0 it is 1.8% behind the
first, over steps 2-9 4.5% ahead of the pick of four (64 GPUs; +1.9% on 256). A fifth finds it,
and over the 15 64-GPU tables it lifted 3 SlimPipe picks by 0.4-1.6% for 1.5% more CPU in all; on
the 256-GPU wikipedia 64K search it cost nothing measurable (232 against 243 s). A front runner
costs one window run per strategy and cap."""
CONFIRM_WITHIN = 0.05
"""Screened layouts within this share of the strategy's best are front runners. One step ranks the
layouts only roughly: over the 30 best-vs-best tables of ``docs/tune``, in 58 of the 162 searches
where several front runners (then within 3%) ran the window, it changed the pick, to layouts
screened up to 2.98% behind, so the cut was binding; and a layout screened 3.4% behind SlimPack's
best was 1.8% ahead on the window (wikipedia 128K, 256 GPUs)."""
DEFERRING_CONFIRM_WITHIN = 0.35
"""For a strategy that defers samples (``DEFERS_SAMPLES``), front runners are the layouts within this
share of its best, by the screen without its drain (``Trial.undrained_tokens_per_s``; ``confirm`` of
them per micro-batch cap, as for every strategy). One step ranks its layouts far less well than
anyone else's: WLB-LLM opens a queue once it holds a document per micro-batch (with few, large
micro-batches within the screened step, with many only later), and the screen with its drain, which
front runners were once taken by, charged one step of every long document held at its end: over
the 30 best-vs-best tables of ``docs/tune`` its confirmed layouts ran the window at 0.93-1.44x
their screened tokens/s then (every other strategy's at most 1.15x; 0.84-6.82x in the tables at
64e5894, whose front runners are taken by this rule), and layouts screened at 0.32M ran the window
at 2.18M tokens/s (wikipedia 256K, 256 GPUs; docs/tune.md)."""
SCREEN_AT_LEAST = 0.5
"""The share of a time limit screening always gets. Past it, screening stops once the rest of the
limit is what every strategy's first confirmation would take. Without it, one slow first layout cut
the screening short: SlimPack's first simulated layout at wikipedia 128K on 256 GPUs (tp1, a 14 s
trial) asks for an estimated 140 s window, which ended a 180 s search's screening at 40 s, although
the layouts it screened next confirm in a third of that time."""
PROTOCOL_WINDOW = Window()
"""The window front runners are confirmed over: the comparison protocol's (``slimpack compare``)."""
MOST_GPUS_SUGGESTED = 2**16
"""When no layout of the budget holds the model, the error names the fewest GPUs that would, up to this."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyTuning:
    strategy: str
    trials: tuple[Trial, ...]
    """Screening, in the order the search considered the layouts (rising floor)."""
    confirmed: tuple[Trial, ...] = ()
    """The front runners over the window, in the order they were confirmed: round by round, best
    screened first (empty without confirmation)."""
    unconfirmed: tuple[Trial, ...] = ()
    """Front runners a time limit left no time to confirm (screened only; not picked)."""
    screened_tokens: int = 0
    """Tokens of the screened steps (what a screening figure's tokens/s is made of)."""

    @property
    def screen_best(self) -> Trial | None:
        ok = [t for t in self.trials if t.ok]
        return max(ok, key=lambda t: t.tokens_per_s) if ok else None

    @property
    def best(self) -> Trial | None:
        """The best over the window when confirmed, else the best screened."""
        if not self.confirmed:
            return self.screen_best
        ok = [t for t in self.confirmed if t.ok]
        return max(ok, key=lambda t: t.tokens_per_s) if ok else None

    def counts(self) -> Counter[str]:
        return Counter(t.status for t in self.trials)

    @property
    def unscreened_ceiling(self) -> float | None:
        """The most screening tokens/s a layout left unscreened by the time limit could reach: the
        screened tokens over its time floor, a true upper bound (None: none was left). At or below
        the best screened figure, the limit changed nothing: the floors would have pruned them."""
        floors = [t.floor_s for t in self.trials if t.status == NOT_SCREENED and t.floor_s]
        return self.screened_tokens / min(floors) if floors else None


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneResult:
    base: Config
    num_gpus: int
    dataset: str
    screen: Window
    """The steps each layout is screened over."""
    window: Window | None
    """The comparison protocol's window the front runners are confirmed over (None: not confirmed)."""
    strategies: tuple[StrategyTuning, ...]
    skipped: Counter[str] = field(default_factory=Counter)
    """Layouts that cannot hold the model at all (every strategy), by reason."""
    wall_s: float = 0.0
    workers: int = 1
    ahead_discarded: int = 0
    """Layouts screened ahead by an idle worker that the in-order search then pruned."""
    time_limit_s: float | None = None
    """The time limit (None: none)."""

    def best_config(self, strategy: str | None = None) -> Config | None:
        """The winning config overall, or ``strategy``'s best."""
        pool = [s for s in self.strategies if strategy in (None, s.strategy) and s.best is not None]
        if not pool:
            return None
        winner = max(pool, key=lambda s: s.best.tokens_per_s)  # type: ignore[union-attr]
        return winner.best.layout.apply(self.base)  # type: ignore[union-attr]


def candidate_layouts(base: Config, num_gpus: int, batches: Sequence[Sequence[Sample]]
                      ) -> tuple[list[tuple[Layout, Config]], Counter[str]]:
    """Every layout with a valid config and model states that fit, and the others' reasons."""
    skipped: Counter[str] = Counter()
    lengths = [s.length for s in batches[0]]
    out = []
    for layout in layouts(base, num_gpus, lengths, skipped):
        try:
            config = layout.apply(base)
            CostModel(config).check_states_fit()
        except UserError as exc:
            skipped[reason(str(exc))] += 1
            continue
        out.append((layout, config))
    return out, skipped



def no_layout_message(base: Config, num_gpus: int, skipped: Counter[str], lengths: Sequence[int]) -> str:
    """Why no layout of ``num_gpus`` GPUs can hold the model, and the fewest GPUs (the budget doubled
    until ``MOST_GPUS_SUGGESTED``) with a layout whose model states fit: what would work."""
    reasons = "; ".join(f"{r} ({n} layout{'s' * (n > 1)})" for r, n in skipped.most_common(3))
    message = f"no layout of {num_gpus} GPUs can hold {base.model.name}: {reasons}"
    gpus = 2 * num_gpus
    while gpus <= MOST_GPUS_SUGGESTED:
        for layout in layouts(base, gpus, lengths, Counter()):
            try:
                CostModel(layout.apply(base)).check_states_fit()
            except UserError:
                continue
            return f"{message}; {gpus} GPUs would hold its model states (e.g. {layout.label()})"
        gpus *= 2
    return f"{message}; no budget of up to {MOST_GPUS_SUGGESTED} GPUs of {base.cluster.name} holds it"


class _Search:
    """One strategy's branch and bound and confirmation, fed trial results in any order."""

    def __init__(self, strategy: str, candidates: Sequence[tuple[Layout, Config]],
                 batches: Sequence[Sequence[Sample]], screen: Window, *, exhaustive: bool,
                 window: Window | None = None, confirm: int = CONFIRM, within: float = CONFIRM_WITHIN,
                 anytime: bool = False) -> None:
        self.strategy, self.screen, self.exhaustive = strategy, screen, exhaustive
        self.anytime = anytime
        """Under a time limit: screen the most promising layout first (``_promise``), not the frontier."""
        self.window, self.confirm = window, confirm
        self.within = max(within, DEFERRING_CONFIRM_WITHIN) if strategy in DEFERS_SAMPLES else within
        self._ranking_figure: Callable[[Trial], float] = (
            (lambda t: t.undrained_tokens_per_s) if strategy in DEFERS_SAMPLES else (lambda t: t.tokens_per_s))
        """What front runners are taken by: a deferring strategy's screen without its drain, which the
        window does not count either (a one-step screen that ends by draining everything held ranked
        WLB-LLM's layouts far from their window figures: wikipedia 256K on 256 GPUs, tp2 pp1 cp2 dp64
        screened 0.32M tokens/s and runs the window at 2.18M, docs/tune.md)."""
        lengths = [[s.length for s in b] for b in batches]
        self.tokens = sum(map(sum, lengths))
        longest = max(max(b) for b in lengths if b)
        self.pruned_first: list[Trial] = []
        ranked = []
        for layout, config in candidates:
            cost = CostModel(config)
            if not exhaustive and memory_floor_bytes(cost, longest, strategy) > config.cluster.usable_memory_bytes:
                self.pruned_first.append(Trial(layout=layout, status=PRUNED_BY_MEMORY))
                continue
            floor = time_floor_s(cost, lengths, strategy)
            ranked.append((floor, layout.label(), layout, config))
            # a baseline at its best: each larger micro-batch cap worth trying is a layout of its
            # own, with the same floors (they bound any grouping of the same work)
            for cap in micro_batch_caps(config)[1:] if strategy in MICRO_BATCH_CAPPED else ():
                capped = dataclasses.replace(layout, micro_batch_tokens=cap)
                ranked.append((floor, capped.label(), capped, capped.apply(config)))
        ranked.sort(key=lambda r: (r[0], r[1]))
        self.ranked = ranked
        self.decided: list[Trial] = []
        """Screening in rank order: the prefix the in-order search has settled."""
        self.pruned_at: int | None = None
        """The rank from which the in-order search pruned by its time floor (None: nothing pruned)."""
        self.results: dict[int, Trial] = {}
        self.submitted: set[int] = set()
        self.best = 0.0
        """The best screened figure of the layouts still in the running: what the floors prune by."""
        self.ahead_discarded = 0
        self.confirmed: dict[int, Trial] = {}
        """Window trials by rank."""
        self.confirm_order: list[int] = []
        """The ranks confirmed or due, in the order they were taken up."""
        self.confirm_due: list[int] = []
        self.unconfirmed: list[int] = []
        """Front runners a time limit left no time to confirm (their screened figures only)."""
        self.finished = False
        self.running = 0
        self.screen_s = 0.0
        """Seconds its screening trials have taken so far (``_next_task``'s last tie-break)."""
        self.out_of_time = False
        """The time limit leaves no time to screen: no new layout is screened once one has simulated."""

    # ---- screening -----------------------------------------------------------------------------
    def _could_win(self, rank: int) -> bool:
        return self.exhaustive or self._ceiling(rank) > self.screened_best

    def _ceiling(self, rank: int) -> float:
        """The most a layout can screen: the screened tokens over its time floor."""
        return self.tokens / self.ranked[rank][0]

    @property
    def screened_best(self) -> float:
        """The best screened figure, settled or screened ahead: a layout whose floor cannot beat it
        cannot be the best screened, whichever it is (ahead, it rises sooner)."""
        return max([self.best, *(t.tokens_per_s for t in self.results.values() if t.ok)])

    def _screened(self) -> dict[int, Trial]:
        """Every layout screened so far, settled or ahead, by rank."""
        return {**dict(enumerate(self.decided)), **self.results}

    def _open_ranks(self) -> Iterator[int]:
        """The layouts not settled, screened or running that could still win, in rank order."""
        return (r for r in range(len(self.decided), len(self.ranked)) if r not in self.submitted and self._could_win(r))

    def _promise(self) -> Callable[[int], float]:
        """A time limit's screening order, the promise of a layout: its ceiling times the best share
        of its ceiling that a simulated layout of the same tp has reached (1 while none has: each tp
        is tried early), by the figure front runners are taken by (a deferring strategy's screen
        without its drain: WLB-LLM's picks screen far below their windows with it).
        The floors leave out memory, so they misjudge the tp degrees differently: at 256 GPUs
        SlimPack's tp1 layouts, the most memory-bound, run at 0.29-0.8 of their floors and have the
        lowest floors, while its tp4 layouts reach 0.89-0.94. Replayed on a virtual clock over seven
        256-GPU cells with a 180 s limit and 2 workers, SlimPack's pick came to 0.993-1.000 of its
        exact search's by promise, against 0.936-1.000 in floor order, every baseline at its exact
        pick both ways (docs/tune.md). Sharing the workers by promise too (``headroom``) starved
        WLB-LLM, whose picks screen far below their windows: 0.924-0.939 in three cells."""
        share: dict[int, float] = {}
        for rank, trial in self._screened().items():
            if trial.ok:  # a layout out of memory says little of the others of its tp
                tp = trial.layout.tp
                share[tp] = max(share.get(tp, 0.0), self._ranking_figure(trial) / self._ceiling(rank))
        return lambda rank: self._ceiling(rank) * share.get(self.ranked[rank][2].tp, 1.0)

    @property
    def headroom(self) -> float:
        """How far its best screened figure could still rise, as a ratio: the screened tokens over the
        floor of the first layout not settled (the lowest left: floors rise in rank order), over the
        best screened (infinite before a layout has simulated, 0 once every layout is settled)."""
        rank, best = len(self.decided), self.screened_best
        if rank == len(self.ranked):
            return 0.0
        return self._ceiling(rank) / best if best > 0 else float("inf")

    def window_estimate_s(self, rank: int) -> float:
        """Estimated seconds of a screened layout's window: its screening trial's seconds per
        screened step times the window's steps (over three 256-GPU cells, a 10-step window took
        6-15x the one-step screen of the same layout; SlimPack's 6-12x, its later steps seeded)."""
        assert self.window is not None
        return self._screened()[rank].wall_s * self.window.end_step / self.screen.steps

    @property
    def failed_windows(self) -> set[int]:
        """Ranks that ran the window and failed there (out of memory or a failed schedule)."""
        return {rank for rank, trial in self.confirmed.items() if not trial.ok}

    @property
    def windows_taken(self) -> int:
        """Front runners that have run the window or are running it."""
        return len(self.confirm_order) - len(self.confirm_due)

    @property
    def has_window_figure(self) -> bool:
        """A front runner has run the window and fitted, or one is running it."""
        return len(self.confirmed) < self.windows_taken or any(trial.ok for trial in self.confirmed.values())

    def first_confirmation_s(self) -> float:
        """What a time limit must leave this search: the estimated window of its best front runner
        while it has no window figure (every strategy gets one), else nothing."""
        if self.window is None or self.has_window_figure:
            return 0.0
        front = self.front_runners(self.failed_windows)
        return self.window_estimate_s(front[0]) if front else 0.0

    @property
    def _cut_short(self) -> bool:
        """Screening stops here: the time limit has passed and some layout has simulated (a search
        with none goes on until one does, so that every strategy has an answer)."""
        return self.out_of_time and self.screened_best > 0

    def settle(self) -> list[Trial]:
        """Settle what the in-order search can: the new screening trials, in order (the pruned ones
        are told when the search finishes, since a round of confirmation can re-open them)."""
        new: list[Trial] = []
        while len(self.decided) < len(self.ranked):
            rank = len(self.decided)
            if not self._could_win(rank):  # floors rise and the best only grows: all the rest too
                self.decided += [Trial(layout=layout, status=PRUNED_BY_BOUND, floor_s=floor)
                                 for floor, _, layout, _ in self.ranked[rank:]]
                self.pruned_at = rank
                self.ahead_discarded += len(self.results)
                self.results.clear()
                self.submitted = {r for r in self.submitted if r < rank}  # a re-opened search submits them anew
                break
            if rank not in self.results:
                if not (self._cut_short and self.running == 0):
                    break
                # past the time limit: what was screened ahead stays, the rest is told unscreened
                # (with its floor, which caps what it could have reached: ``unscreened_ceiling``)
                floor, _, layout, _ = self.ranked[rank]
                self.decided.append(Trial(layout=layout, status=NOT_SCREENED, floor_s=floor))
                new.append(self.decided[-1])
                continue
            trial = self.results.pop(rank)
            self.decided.append(trial)
            new.append(trial)
            if trial.ok:
                self.best = max(self.best, trial.tokens_per_s)
        return new

    def receive(self, rank: int, trial: Trial) -> None:
        """A screening result; one for a layout the in-order search has since pruned is dropped."""
        if rank < len(self.decided):
            self.ahead_discarded += 1
        else:
            self.results[rank] = trial

    @property
    def screened(self) -> bool:
        return len(self.decided) == len(self.ranked)

    def next_screen(self, *, ahead: bool) -> int | None:
        """The frontier layout if not yet running; with ``ahead``, else the next one that could
        still win. Under a time limit, the most promising one that could still win (``_promise``)."""
        if self._cut_short:
            return None
        if self.anytime:  # the most promising, ahead or not (ties: the lower floor)
            promise = self._promise()
            return max(self._open_ranks(), key=lambda r: (promise(r), -r), default=None)
        frontier = len(self.decided)
        return next((r for r in self._open_ranks() if ahead or r == frontier), None)

    def screen_task(self, rank: int) -> Task:
        self.submitted.add(rank)
        floor, _, layout, config = self.ranked[rank]
        return Task(self.strategy, layout, config, "screen", self.screen, None if self.exhaustive else floor,
                    reject_oom=not self.exhaustive)

    # ---- confirmation --------------------------------------------------------------------------
    def advance(self) -> list[Trial]:
        """Move the search on as far as the results in allow: settle the screening and, once it and
        a round of confirmation are done, re-open what a failed front runner pruned or take up the
        next round. The trials it settled, in order. A re-opened screening can settle at once (past
        the time limit, what it re-opens is told unscreened), so rounds are taken up until one waits
        for trials."""
        new = self.settle()
        while not (self.finished or not self.screened or self.confirm_due
                   or len(self.confirmed) < len(self.confirm_order)):
            if self.window is not None and self._next_round():
                new += self.settle()
                continue
            self.finished = True
            new += [t for t in self.decided if t.status == PRUNED_BY_BOUND]
        return new

    def _next_round(self) -> bool:
        """Drop the layouts that failed the window from the running: re-open the screening if the
        best that remains lets a pruned layout win, else queue the front runners not yet confirmed.
        False when there is nothing left to do."""
        failed = self.failed_windows
        self.best = max((t.tokens_per_s for rank, t in enumerate(self.decided) if t.ok and rank not in failed),
                        default=0.0)
        if self.pruned_at is not None and self._could_win(self.pruned_at):
            del self.decided[self.pruned_at:]
            self.pruned_at = None
            return True
        front = self.front_runners(failed)
        if not any(trial.ok for trial in self.confirmed.values()):
            # every window run so far failed: the front runners left out for time are taken up again
            # (one was left out while the first still ran), so that the strategy gets a window figure
            self.unconfirmed = [rank for rank in self.unconfirmed if rank not in front]
        self.confirm_due = [rank for rank in front if rank not in self.confirmed and rank not in self.unconfirmed]
        self.confirm_order += self.confirm_due
        return bool(self.confirm_due)

    def front_runners(self, failed: set[int]) -> list[int]:
        """The ranks to have run the window, best screened first: the screened layouts that have
        not failed it within ``within`` of the best of them, at most ``confirm`` per micro-batch cap.
        Per cap, because a layout's larger caps often screen within a hair of it (where they change
        few micro-batches) and would otherwise fill the front runners with one layout: at textbooks
        128K on 64 GPUs ByteScale's three were two caps of one layout and a layout out of memory,
        which left out the layout that ran the window 31% faster."""
        figure, screened = self._ranking_figure, self._screened()
        ranked = sorted((rank for rank, t in screened.items() if t.ok and rank not in failed),
                        key=lambda rank: (-figure(screened[rank]), rank))
        top = figure(screened[ranked[0]]) if ranked else 0.0
        taken: Counter[int | None] = Counter()
        front = []
        for rank in ranked:
            trial = screened[rank]
            if figure(trial) >= (1 - self.within) * top and taken[trial.layout.micro_batch_tokens] < self.confirm:
                taken[trial.layout.micro_batch_tokens] += 1
                front.append(rank)
        return front

    def next_confirm(self, now: float = 0.0, deadline: float = float("inf")) -> int | None:
        """The next front runner to confirm, best screened first. One whose window would end past
        ``deadline`` is left unconfirmed, unless the search has no window figure yet nor one on the
        way (every strategy gets one: its best screened that fits the window)."""
        while self.confirm_due:
            needed = not self.has_window_figure
            rank = self.confirm_due.pop(0)
            if needed or now + self.window_estimate_s(rank) <= deadline:
                return rank
            self.confirm_order.remove(rank)
            self.unconfirmed.append(rank)
        return None

    def confirm_task(self, rank: int) -> Task:
        _, _, layout, config = self.ranked[rank]
        assert self.window is not None
        return Task(self.strategy, layout, config, "window", self.window)

    def tuning(self) -> StrategyTuning:
        confirmed = tuple(self.confirmed[rank] for rank in self.confirm_order if rank in self.confirmed)
        return StrategyTuning(strategy=self.strategy, trials=(*self.pruned_first, *self.decided), confirmed=confirmed,
                              unconfirmed=tuple(self.decided[rank] for rank in self.unconfirmed),
                              screened_tokens=self.tokens)


def _next_task(searches: Sequence[_Search], now: float = 0.0, deadline: float = float("inf")
               ) -> tuple[_Search, Task, int] | None:
    """What an idle worker runs: a due confirmation, else the frontier layout of the search with
    the fewest trials running and, among those, the most headroom (then the fewest screening seconds
    spent), else a layout screened ahead. Under a time limit this spends the time where a best could
    still rise the most. Replayed on a virtual clock over seven 256-GPU cells with a 180 s limit and
    2 workers (docs/tune.md), every baseline reached its full search's figure either way, and SlimPack's
    pick came to 0.936-1.000 of its full search's by headroom (geometric mean 0.977) against
    0.872-1.000 (0.946) with the time shared by screening seconds. Without a limit the order changes
    only what is screened ahead, not what the search finds. Due confirmations go first to a search
    with no window figure yet, then to the one that has run the fewest: under a time limit the
    windows that end in time (``_Search.next_confirm``) are shared out, not taken in the order the
    strategies were named."""
    for search in sorted(searches, key=lambda s: (s.has_window_figure, s.windows_taken)):
        rank = search.next_confirm(now, deadline)
        if rank is not None:
            return search, search.confirm_task(rank), rank
    for ahead in (False, True):
        for search in sorted(searches, key=lambda s: (s.running, -s.headroom, s.screen_s)):
            rank = search.next_screen(ahead=ahead)
            if rank is not None:
                return search, search.screen_task(rank), rank
    return None


def confirm_reserve_s(searches: Sequence[_Search], workers: int) -> float:
    """Estimated seconds to give every search a window figure (``_Search.first_confirmation_s``):
    shared over the workers, at least the longest one. Only the first: the rest of the front runners
    are confirmed as time allows (``_Search.next_confirm``). Reserving time for all of them cut the
    screening far too early: at 256 GPUs SlimPack's windows alone took 150-330 CPU-s (docs/tune.md)."""
    due = [search.first_confirmation_s() for search in searches]
    return max([sum(due) / workers, *due], default=0.0)


def _run(searches: Sequence[_Search], trials: Trials, on_trial: Callable[[str, Trial], None],
         deadline: float = float("inf"), screen_from: float = float("inf")) -> None:
    """Keep the workers busy until every search is settled and confirmed. From ``screen_from``
    (``time.perf_counter``) no new layout is screened once ``deadline`` leaves only the time to give
    every search a window figure (``confirm_reserve_s``), once a search has one that simulated."""
    running: dict[Future[Trial], tuple[_Search, Task, int]] = {}
    while True:
        now = time.perf_counter()
        out_of_time = now >= screen_from and now + confirm_reserve_s(searches, trials.workers) >= deadline
        for search in searches:
            search.out_of_time = search.out_of_time or out_of_time  # once cut, screening stays cut
            for trial in search.advance():
                on_trial(search.strategy, trial)
        while len(running) < trials.workers and (job := _next_task(searches, now, deadline)) is not None:
            search, task, rank = job
            search.running += 1
            running[trials.submit(task)] = (search, task, rank)
        if not running:
            if all(s.finished for s in searches):
                return
            # front runners were just left unconfirmed: the searches take up their next round (each
            # pass confirms or leaves out one more of finitely many front runners, or finishes)
            continue
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in finished:
            search, task, rank = running.pop(future)
            search.running -= 1
            trial = future.result()
            if task.phase == "window":
                search.confirmed[rank] = trial
                on_trial(search.strategy, trial)
            else:
                search.screen_s += trial.wall_s
                search.receive(rank, trial)


def tune(base: Config, dataset: Dataset, num_gpus: int, strategies: Sequence[str], *, screen_steps: int = 1,
         window: Window | None = PROTOCOL_WINDOW, confirm: int = CONFIRM, confirm_within: float = CONFIRM_WITHIN,
         exhaustive: bool = False, workers: int = 1, time_limit_s: float | None = None,
         on_screen_total: Callable[[int], None] = lambda n: None,
         on_trial: Callable[[str, Trial], None] = lambda s, t: None) -> TuneResult:
    """The best layout of each strategy for ``num_gpus`` GPUs; ``base`` gives the model, cluster,
    context, batch and planner settings (its parallel layout and recomputation are searched).
    Layouts are screened over steps ``0 .. screen_steps - 1``; the front runners (``confirm``, 0 =
    none) are confirmed over ``window`` (see the module docstring). ``workers`` > 1 runs trials in
    that many worker processes. With ``time_limit_s`` the search ends about that many seconds after it
    began (see the module docstring: the windows are estimated, a trial running is never cut, and
    every strategy confirms one front runner whatever the time). ``on_screen_total`` hears how many
    screening trials there are (a
    layout per micro-batch cap searched), ``on_trial`` of each screening trial as the search settles
    it (the pruned ones when the search finishes) and of each confirmation as it ends."""
    check_strategies(strategies)
    if num_gpus > MOST_GPUS:  # else the first layout's config refuses it, in a layout's words
        raise UserError(f"--gpus {num_gpus}: at most 2**20 ({MOST_GPUS:,}) GPUs are laid out")
    if screen_steps < 1:
        raise UserError(f"--screen-steps must be >= 1, got {screen_steps}")
    if confirm < 0:
        raise UserError(f"--confirm must be >= 0, got {confirm}")
    if time_limit_s is not None and not time_limit_s >= 0:
        raise UserError(f"--time-limit must be >= 0 seconds, got {time_limit_s}")
    window = window if confirm else None
    began = time.perf_counter()
    batches = stream_batches(dataset, base, screen_steps)
    candidates, skipped = candidate_layouts(base, num_gpus, batches)
    if not candidates:
        raise UserError(no_layout_message(base, num_gpus, skipped, [s.length for s in batches[0]]))
    screen = Window(warmup_steps=0, steps=screen_steps)
    searches = [_Search(name, candidates, batches, screen, exhaustive=exhaustive, window=window, confirm=confirm,
                        within=confirm_within, anytime=time_limit_s is not None) for name in strategies]
    on_screen_total(sum(len(s.pruned_first) + len(s.ranked) for s in searches))
    for search in searches:
        for trial in search.pruned_first:
            on_trial(search.strategy, trial)
    trials = Trials(dataset, workers)
    try:
        if time_limit_s is None:
            _run(searches, trials, on_trial)
        else:
            _run(searches, trials, on_trial, began + time_limit_s, began + SCREEN_AT_LEAST * time_limit_s)
    finally:
        trials.close()
    return TuneResult(base=base, num_gpus=num_gpus, dataset=dataset.name, screen=screen, window=window,
                      strategies=tuple(s.tuning() for s in searches), skipped=skipped,
                      wall_s=time.perf_counter() - began, workers=workers, time_limit_s=time_limit_s,
                      ahead_discarded=sum(s.ahead_discarded for s in searches))
