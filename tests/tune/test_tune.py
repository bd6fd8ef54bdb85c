"""``slimpack.tune``: the layouts it enumerates, the floors it prunes by, and the best it finds
(the same as simulating every layout)."""

import dataclasses
import re
from collections import Counter

import pytest

from slimpack.compare.run import Window, run_strategy
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.data import load_dataset
from slimpack.errors import UserError
from slimpack.sim import simulate
from slimpack.strategies import make_planner
from slimpack.strategies.stream import stream_batches
from slimpack.tune import search as search_module
from slimpack.tune import tune
from slimpack.tune.bounds import memory_floor_bytes, time_floor_s
from slimpack.tune.layouts import RECOMPUTE, layouts
from slimpack.tune.report import unscreened_lines
from slimpack.tune.search import (
    NOT_SCREENED,
    PRUNED_BY_BOUND,
    PRUNED_BY_MEMORY,
    _Search,
    candidate_layouts,
)
from slimpack.tune.trials import PLAN_OOM, SIMULATED, SIMULATED_OOM, Trial, failure_status

BASE = build_config(model="llama2-7b", train=TrainConfig(max_context=16384, global_batch_tokens=2**17))
WIKIPEDIA = load_dataset("wikipedia")


def test_layouts_of_8_gpus_hand_counted():
    skipped = Counter()
    found = list(layouts(BASE, 8, [4096] * 4, skipped))
    # powers of two (tp, pp, cp) with tp·pp·cp | 8: C(6, 3) = 20 triples, C(5, 3) = 10 of them with pp > 1,
    # which are also interleaved; llama2-7b's 32 layers split evenly over every pp·vpp <= 16 and its
    # head is light: no uneven split
    assert len(found) == (20 + 10) * len(RECOMPUTE)
    assert {(x.tp * x.pp * x.cp * x.dp) for x in found} == {8}
    assert not skipped


def test_tp_must_divide_heads_and_kv_heads():
    qwen = build_config(model="qwen2.5-7b", train=TrainConfig(max_context=4096))  # 28 heads, 4 KV heads
    skipped = Counter()
    found = list(layouts(qwen, 8, [4096] * 4, skipped))
    assert {x.tp for x in found} == {1, 2, 4}
    assert skipped["tp does not divide the heads, KV heads or MLP width"] == 1
    # 28 layers do not split over pp·vpp = 8 or 16: those layouts come with a balanced uneven split
    assert all(sum(x.stage_layers) == 28 for x in found if x.pp * x.vpp in (8, 16))
    assert any(x.stage_layers for x in found if x.pp * x.vpp == 8)


@pytest.mark.parametrize("cut_documents", [False, True])
@pytest.mark.parametrize("strategy", ["fixed", "kk", "slimpipe", "slimpack"])
def test_floors_are_below_what_the_simulator_reports(strategy, cut_documents):
    train = dataclasses.replace(BASE.train, cut_documents=cut_documents)  # the floors read the batch as cut
    batches = stream_batches(WIKIPEDIA, dataclasses.replace(BASE, train=train), 1)
    lengths = [[s.length for s in b] for b in batches]
    for parallel in (ParallelConfig(tp=2, pp=2, dp=1), ParallelConfig(pp=4, dp=2, cp=2), ParallelConfig(tp=4, cp=2)):
        config = build_config(model="llama2-7b", parallel=parallel, train=train)
        cost = CostModel(config)
        result = simulate(make_planner(strategy, config).plan(batches[0], step=0))
        assert time_floor_s(cost, lengths, strategy) <= result.step_time_s
        assert memory_floor_bytes(cost, max(lengths[0]), strategy) <= max(result.peak_memory_bytes)


def test_tune_finds_the_same_best_as_exhaustive_simulation():
    strategies = ["fixed", "kk", "wlb", "slimpack"]
    pruned = tune(BASE, WIKIPEDIA, 4, strategies, confirm=0)
    every = tune(BASE, WIKIPEDIA, 4, strategies, confirm=0, exhaustive=True)
    tokens = sum(s.length for s in stream_batches(WIKIPEDIA, BASE, 1)[0])
    for fast, full in zip(pruned.strategies, every.strategies, strict=True):
        assert fast.best.layout == full.best.layout
        assert fast.best.tokens_per_s == full.best.tokens_per_s
        assert fast.counts()[PRUNED_BY_BOUND] > 0
        assert not any(t.status.startswith("pruned") for t in full.trials)  # exhaustive: every layout simulated
        # a baseline's larger micro-batch caps are layouts of their own (SlimPack has none)
        assert any(t.layout.micro_batch_tokens for t in full.trials) == (fast.strategy != "slimpack")
        status = {t.layout: t.status for t in fast.trials}
        for trial in full.trials:
            floor = next(t.floor_s for t in fast.trials if t.layout == trial.layout)
            if trial.ok and floor is not None:  # the floor never exceeds the simulated run's time
                assert floor <= tokens / trial.tokens_per_s * (1 + 1e-9)
            # the memory checks are exact: what they prune the simulator finds out of memory (or it fails
            # the plan's schedule first), and the simulator finds out of memory only what they or the
            # time floor pruned
            assert (status[trial.layout] in (PLAN_OOM, PRUNED_BY_MEMORY)) <= (
                trial.status == SIMULATED_OOM or trial.status.startswith("failed"))
            assert (trial.status == SIMULATED_OOM) <= (status[trial.layout] in (PLAN_OOM, PRUNED_BY_MEMORY,
                                                                               PRUNED_BY_BOUND))
    assert sum(s.counts()[PLAN_OOM] for s in pruned.strategies) > 0
    assert pruned.best_config().parallel.num_devices == 4


def test_a_time_limit_leaves_layouts_unscreened_under_a_true_ceiling():
    # with no time at all, each strategy screens in order until a layout simulates, then stops: the
    # layouts left are told unscreened (or pruned, where that layout's floor already cannot win), and
    # their floors cap what any of them screens in the exhaustive search
    strategies = ["fixed", "kk", "slimpack"]
    limited = tune(BASE, WIKIPEDIA, 4, strategies, confirm=0, time_limit_s=0)
    every = tune(BASE, WIKIPEDIA, 4, strategies, confirm=0, exhaustive=True)
    unlimited = tune(BASE, WIKIPEDIA, 4, strategies, confirm=0)
    generous = tune(BASE, WIKIPEDIA, 4, strategies, confirm=0, time_limit_s=3600)
    for cut, full, plain, late in zip(limited.strategies, every.strategies, unlimited.strategies,
                                      generous.strategies, strict=True):
        first = next(i for i, t in enumerate(cut.trials) if t.ok)
        assert {t.status for t in cut.trials[first + 1:]} <= {NOT_SCREENED, PRUNED_BY_BOUND}
        unscreened = {t.layout for t in cut.trials if t.status == NOT_SCREENED}
        assert unscreened and all(t.floor_s for t in cut.trials if t.layout in unscreened)
        ceiling = cut.unscreened_ceiling
        assert max(t.tokens_per_s for t in full.trials if t.layout in unscreened) <= ceiling
        assert cut.screen_best.tokens_per_s < full.screen_best.tokens_per_s <= ceiling or (
            cut.screen_best.layout == full.screen_best.layout)
        # a limit not reached leaves nothing unscreened and finds the exact best screened; screening by
        # promise can meet layouts the exact search prunes before the best is known, never fewer
        assert plain.unscreened_ceiling is None and late.unscreened_ceiling is None
        assert late.screen_best == plain.screen_best
        screened = {t.layout: t for t in late.trials if t.floor_s and t.status != PRUNED_BY_BOUND}
        assert all(screened[t.layout] == t for t in plain.trials if t.floor_s and t.status != PRUNED_BY_BOUND)


def test_past_the_time_limit_a_failed_front_runner_re_opens_nothing_to_screen():
    # kk's best screened layout fails the window, which re-opens the layouts its figure pruned; past
    # the time limit they are told unscreened at once, and the search still ends (two workers: the
    # order that once left the search waiting for trials that would never come)
    result = tune(BASE, WIKIPEDIA, 4, ["fixed", "kk"], time_limit_s=0, workers=2)
    kk = result.strategies[1]
    assert any(not t.ok for t in kk.confirmed) and kk.best is not None and kk.best.phase == "window"
    assert kk.counts()[NOT_SCREENED] > 0 and kk.unscreened_ceiling > kk.screen_best.tokens_per_s
    # past the limit a strategy confirms front runners until one runs the window (kk: its third)
    for tuning in result.strategies:
        assert sum(t.ok for t in tuning.confirmed) == 1 and tuning.confirmed[-1].ok


def test_a_limit_leaves_screening_time_for_every_strategys_first_window(monkeypatch):
    # once screening has had its share of the limit, it stops where what is left is what the first
    # windows need: with no share and a reserve longer than any limit, a 3600 s search screens as
    # one with no time at all
    from slimpack.tune import search
    monkeypatch.setattr(search, "SCREEN_AT_LEAST", 0.0)
    monkeypatch.setattr(search, "confirm_reserve_s", lambda searches, workers: 1e9)
    strategies = ["fixed", "slimpack"]
    reserved = tune(BASE, WIKIPEDIA, 4, strategies, time_limit_s=3600)
    none_left = tune(BASE, WIKIPEDIA, 4, strategies, time_limit_s=0)
    assert [s.trials for s in reserved.strategies] == [s.trials for s in none_left.strategies]
    assert all(s.counts()[NOT_SCREENED] > 0 for s in reserved.strategies)


def _two_speeds_search(strategy: str, speeds: list[float], walls: list[float]) -> _Search:
    """A search whose first layouts screened at ``speeds`` tokens/s, each trial taking ``walls`` s."""
    batches = stream_batches(WIKIPEDIA, BASE, 1)
    candidates, _ = candidate_layouts(BASE, 4, batches)
    search = _Search(strategy, candidates, batches, Window(warmup_steps=0, steps=1), exhaustive=True,
                     window=Window(warmup_steps=2, steps=8))
    search.decided = [Trial(layout=layout, status=SIMULATED, tokens_per_s=speed, wall_s=wall)
                      for (layout, _), speed, wall in zip(candidates, speeds, walls, strict=False)]
    return search


def test_the_first_window_is_reserved_and_the_others_run_only_where_they_end_in_time():
    # front runners: 100 and 97 (within 5%); a window of 2 + 8 steps is estimated at 10 one-step screens
    first = _two_speeds_search("kk", [100, 97, 50], [3.0, 1.0, 2.0])
    other = _two_speeds_search("fixed", [80], [1.0])
    assert first.first_confirmation_s() == 30.0 and other.first_confirmation_s() == 10.0
    # 30 + 10 s over two workers is 20 s, but the 30 s window alone takes 30 s; over one worker 40 s
    assert search_module.confirm_reserve_s([first, other], 2) == 30.0
    assert search_module.confirm_reserve_s([first, other], 1) == 40.0
    first._next_round()
    # the best front runner runs though its window ends past the deadline; the next (10 s) would
    # too, and is told unconfirmed
    assert first.next_confirm(now=0.0, deadline=5.0) == 0
    assert first.first_confirmation_s() == 0.0  # its window figure is on the way
    assert first.next_confirm(now=0.0, deadline=5.0) is None and first.unconfirmed == [1]
    roomy = _two_speeds_search("kk", [100, 97, 50], [3.0, 1.0, 2.0])
    roomy._next_round()
    assert [roomy.next_confirm(now=0.0, deadline=10.0) for _ in range(3)] == [0, 1, None] and not roomy.unconfirmed


def test_due_windows_go_first_where_there_is_no_window_figure_then_to_the_fewest_run():
    # kk is named first and has one window running; fixed has none yet: fixed's is taken first,
    # then, with one window each, the order they were named breaks the tie
    first = _two_speeds_search("kk", [100, 97, 50], [3.0, 1.0, 2.0])
    other = _two_speeds_search("fixed", [80, 79], [1.0, 1.0])
    first._next_round()
    other._next_round()
    assert first.next_confirm() == 0 and first.has_window_figure and first.windows_taken == 1
    assert not other.has_window_figure
    assert search_module._next_task([first, other])[:3:2] == (other, 0)
    assert other.windows_taken == 1
    assert search_module._next_task([first, other])[:3:2] == (first, 1)


def test_a_time_limit_screens_the_most_promising_layout_first():
    batches = stream_batches(WIKIPEDIA, BASE, 1)
    candidates, _ = candidate_layouts(BASE, 4, batches)
    search = _Search("fixed", candidates, batches, Window(warmup_steps=0, steps=1), exhaustive=False, anytime=True)
    ceiling = [search.tokens / floor for floor, *_ in search.ranked]
    tp = [layout.tp for _, _, layout, _ in search.ranked]

    def screen(rank, share, status=SIMULATED):
        assert search.next_screen(ahead=False) == rank
        search.screen_task(rank)
        floor, _, layout, _ = search.ranked[rank]
        search.receive(rank, Trial(layout=layout, status=status, floor_s=floor, tokens_per_s=share * ceiling[rank]))

    first_tp2 = tp.index(2)
    next_tp2 = tp.index(2, first_tp2 + 1)
    # the layouts this is built on: tp1 has the lowest floors, and tp4's best ceiling is below what
    # tp2's first layout will screen, so it is pruned
    assert tp[:2] == [1, 1] and max(ceiling[r] for r in range(len(tp)) if tp[r] == 4) < 0.95 * ceiling[first_tp2]
    # nothing simulated: the highest ceiling first; a layout out of memory leaves its tp's promise at 1
    screen(0, 0.0, PLAN_OOM)
    screen(1, 0.5)
    # tp1 screens at half its ceiling, so tp2's best ceiling, untried, promises more than any tp1 layout
    screen(first_tp2, 0.95)
    # then tp2 at 95% of its ceilings against tp1 at 50%: the next tp2 layout, although tp1 layouts
    # have higher ceilings (and are the frontier, which a search without a limit screens next)
    assert ceiling[2] > ceiling[next_tp2] and 0.95 * ceiling[next_tp2] > 0.5 * ceiling[2]
    assert search.next_screen(ahead=False) == next_tp2


def test_idle_workers_go_to_the_search_whose_best_could_rise_the_most():
    # two searches with their first layout screened, one at half its floor's throughput and one at
    # 90%: the first has the more headroom (the next floor over its best), so it is screened next
    # although it has spent more screening seconds; with equal headroom, the fewer seconds go first
    def screened_once(strategy: str, share: float, seconds: float) -> _Search:
        batches = stream_batches(WIKIPEDIA, BASE, 1)
        candidates, _ = candidate_layouts(BASE, 4, batches)
        search = _Search(strategy, candidates, batches, Window(warmup_steps=0, steps=1), exhaustive=False)
        search.receive(0, Trial(layout=search.ranked[0][2], status=SIMULATED,
                                tokens_per_s=share * search.tokens / search.ranked[0][0]))
        search.settle()
        search.screen_s = seconds
        return search

    slow, fast = screened_once("kk", 0.5, 100.0), screened_once("fixed", 0.9, 0.0)
    assert slow.headroom > fast.headroom > 1.0
    assert search_module._next_task([fast, slow])[0] is slow
    twin = screened_once("bfd", 0.5, 50.0)
    assert search_module._next_task([slow, twin])[0] is twin


def test_front_runners_are_confirmed_over_the_comparison_window():
    window = Window(warmup_steps=1, steps=8)
    screened = tune(BASE, WIKIPEDIA, 4, ["fixed", "kk"], confirm=0)
    result = tune(BASE, WIKIPEDIA, 4, ["fixed", "kk"], window=window, confirm=3, confirm_within=0.03)
    assert result.window == window
    for after in result.strategies:
        best = after.best
        assert best.phase == "window" and best.ok
        # the figure is the comparison protocol's own, over the same window
        row = run_strategy(after.strategy, best.layout.apply(BASE), WIKIPEDIA, window).metrics()
        assert best.tokens_per_s == row.tokens_per_s and best.efficiency == row.efficiency
    (fixed_before, kk_before), (fixed, kk) = screened.strategies, result.strategies
    # fixed: confirmation does not change the screening, and its front runners all run the window
    assert fixed.trials == fixed_before.trials and all(t.ok for t in fixed.confirmed)
    front = [t for t in fixed.trials if t.ok and t.tokens_per_s >= 0.97 * fixed.screen_best.tokens_per_s]
    assert [t.layout for t in fixed.confirmed] == [t.layout for t in sorted(front, key=lambda t: -t.tokens_per_s)][:3]
    assert fixed.best.layout == fixed.screen_best.layout
    # 4 GPUs, 16K context: kk's best screened layout (tp1 cp2) fits step 0's batch but runs out of
    # memory later in the window, so it leaves the running: the layouts its figure pruned whose floors
    # beat the best that remains are screened after all, and the pick moves on
    assert kk.confirmed[0].layout == kk.screen_best.layout and kk.confirmed[0].status == SIMULATED_OOM
    failed = {t.layout for t in kk.confirmed if not t.ok}
    remaining = max(t.tokens_per_s for t in kk.trials if t.ok and t.layout not in failed)
    tokens = sum(s.length for s in stream_batches(WIKIPEDIA, BASE, 1)[0])
    before = {t.layout: t for t in kk_before.trials}
    reopened = [t for t in kk.trials if t != before[t.layout]]
    assert reopened and all(before[t.layout].status == PRUNED_BY_BOUND and t.ok for t in reopened)
    assert all(tokens / t.floor_s > remaining for t in reopened)
    assert all(tokens / t.floor_s <= remaining for t in kk.trials if t.status == PRUNED_BY_BOUND)
    assert kk.best.layout not in failed and kk.best.layout != kk.screen_best.layout


def test_no_layout_fits_is_one_user_error_that_names_the_fewest_gpus_that_would():
    big = build_config(model="llama2-70b", train=TrainConfig(max_context=4096))
    batches = stream_batches(WIKIPEDIA, big, 1)
    for gpus in (1, 6):
        with pytest.raises(UserError, match=f"no layout of {gpus} GPUs can hold llama2-70b") as raised:
            tune(big, WIKIPEDIA, gpus, ["fixed"])
        suggested = int(re.search(r"; (\d+) GPUs would hold its model states", str(raised.value)).group(1))
        # the budget doubled: the suggestion holds the model states and half of it does not
        assert suggested > gpus and suggested % gpus == 0 and (suggested // gpus).bit_count() == 1
        assert candidate_layouts(big, suggested, batches)[0] and not candidate_layouts(big, suggested // 2, batches)[0]


def test_a_search_well_past_its_limit_says_why():
    # no limit cuts a trial, and every strategy screens one layout: a 0 s limit always runs over
    result = tune(BASE, WIKIPEDIA, 4, ["fixed", "kk"], confirm=0, time_limit_s=0)
    longest = max(t.wall_s for tuning in result.strategies for t in tuning.trials)
    overrun = unscreened_lines(dataclasses.replace(result, wall_s=10.0))[0]
    assert overrun == ("the search took 10 s against the 0 s limit: every strategy screens and confirms at least "
                       f"one layout, and a trial is never cut (the longest took {longest:.1f} s)")
    # within a second (or a quarter) of the limit nothing is said
    assert not any(line.startswith("the search took") for line in unscreened_lines(dataclasses.replace(result, wall_s=1.0)))
    assert not any(line.startswith("the search took") for line in
                   unscreened_lines(dataclasses.replace(result, wall_s=13.0, time_limit_s=12.0)))


def test_a_failed_trial_is_counted_under_its_strategy():
    assert failure_status("slimpipe", "slimpipe: its slice-level 1F1B runs without interleaved stages; got 2 "
                          "virtual stages (use --vpp 1)") == (
        "failed (slimpipe): its slice-level 1F1B runs without interleaved stages")
    assert failure_status("kk", "pipelines[0]: interleaved 1F1B needs a multiple of pp=4 groups per pipeline, got 2") == (
        "failed (kk): pipelines[N]: interleaved 1F1B needs a multiple of pp=N groups per pipeline, got N")


def test_worker_processes_find_what_one_process_finds():
    def summary(result):
        return [[(t.layout, t.status, t.tokens_per_s) for t in (*s.trials, *s.confirmed)] for s in result.strategies]

    # kk on 4 GPUs: its best screened layout fails the window, which re-opens its screening
    for gpus, strategies, window in ((2, ["fixed", "bfd"], Window(warmup_steps=0, steps=2)),
                                     (4, ["kk", "fixed"], Window(warmup_steps=1, steps=8))):
        one = tune(BASE, WIKIPEDIA, gpus, strategies, window=window, confirm_within=0.03)
        two = tune(BASE, WIKIPEDIA, gpus, strategies, window=window, confirm_within=0.03, workers=2)
        assert summary(two) == summary(one)
        assert [s.strategy for s in two.strategies] == strategies
    assert any(not t.ok for t in one.strategies[0].confirmed)


def test_screening_ahead_settles_as_the_in_order_search_does():
    # feed a search the same trial results in layout order, and out of order with layouts screened
    # ahead: the settled trials are the same, and what the in-order search pruned is dropped
    batches = stream_batches(WIKIPEDIA, BASE, 1)
    candidates, _ = candidate_layouts(BASE, 4, batches)

    def search():
        return _Search("fixed", candidates, batches, Window(warmup_steps=0, steps=1), exhaustive=False)

    ranked = search().ranked
    tokens = search().tokens
    # each layout runs at 90% of its floor's throughput: the first one is the best, and every layout
    # whose floor allows less than 90% of the first floor's throughput is pruned in order
    results = [Trial(layout=layout, status=SIMULATED, tokens_per_s=0.9 * tokens / floor)
               for floor, _, layout, _ in ranked]
    in_order = search()
    for rank, trial in enumerate(results):
        if in_order.screened:
            break
        in_order.receive(rank, trial)
        in_order.settle()
    simulated = [t for t in in_order.decided if t.ok]
    assert 1 < len(simulated) < len(ranked) and in_order.screened and in_order.ahead_discarded == 0
    assert all(tokens / floor > 0.9 * tokens / ranked[0][0] for floor, *_ in ranked[:len(simulated)])
    ahead = search()
    for rank in reversed(range(len(simulated) + 2)):  # two layouts past the last one the search keeps
        ahead.receive(rank, results[rank])
    ahead.settle()
    assert ahead.decided == in_order.decided and ahead.ahead_discarded == 2


@pytest.mark.parametrize(("strategy", "speeds", "front", "front_once_the_best_failed"), [
    ("kk", (30, 90, 100, 50, 70, 97, 40, 60), [100, 97], [97]),  # within 5%
    # 95.5: its cap's fourth
    ("kk", (99, 100, 98, 99.5, 97, 96, 95.5, 80), [100, 99.5, 99, 98, 97, 96], [99.5, 99, 98, 97, 96]),
    ("wlb", (30, 90, 100, 50, 70, 97, 40, 60), [100, 97, 90, 70], [97, 90, 70]),  # within 35%, 3 per cap
    # 80 and 70: their caps' fourth, until 100 fails the window
    ("wlb", (99, 90, 100, 80, 70, 97, 95, 85), [100, 99, 97, 95, 90, 85], [99, 97, 95, 90, 85, 70]),
])
def test_front_runners_are_taken_per_cap_and_within_35_percent_for_a_strategy_that_defers_samples(
        strategy, speeds, front, front_once_the_best_failed):
    """A layout's larger caps can screen within a hair of it and fill the front runners; and wlb's
    one-step screen ends with the drain of what it held, which the window does not count. The layouts
    at odd positions get a cap of twice the context. A layout that failed the window is out of the
    running: the front runners are taken from the rest."""
    batches = stream_batches(WIKIPEDIA, BASE, 1)
    candidates, _ = candidate_layouts(BASE, 4, batches)
    layouts = [dataclasses.replace(layout, micro_batch_tokens=2 * 16384 if i % 2 else None)
               for i, (layout, _) in enumerate(candidates[:len(speeds)])]
    search = _Search(strategy, candidates, batches, Window(warmup_steps=0, steps=1), exhaustive=True, confirm=3,
                     within=0.05)
    # wlb's front runners go by its screen without the drain (the drained figures here rank the other
    # way round); every other strategy's by its screened figure
    defers = strategy == "wlb"
    search.decided = [Trial(layout=layout, status=SIMULATED, tokens_per_s=1000 - speed if defers else speed,
                            undrained_tokens_per_s=speed if defers else 0.0)
                      for layout, speed in zip(layouts, speeds, strict=True)]
    assert [speeds[rank] for rank in search.front_runners(set())] == front
    assert [speeds[rank] for rank in search.front_runners({speeds.index(100)})] == front_once_the_best_failed
