import heapq

from hypothesis import given
from hypothesis import strategies as st

from slimpack.strategies.karmarkar_karp import karmarkar_karp
from slimpack.strategies.packing import (
    best_fit_decreasing,
    contiguous_cuts,
    least_loaded_fit,
    small_at_ends,
    smallest_count,
)


def sums(weights, subsets):
    return [sum(weights[i] for i in s) for s in subsets]


def test_best_fit_decreasing_by_hand():
    # sorted: 7(1) 6(5) 5(0) 4(4) 3(2) 2(3) 1(6); capacity 10
    # 7 -> new bin A (room 3); 6 -> new B (room 4); 5 -> new C (room 5);
    # 4 -> best fit is B (room 4 -> 0); 3 -> A (3 -> 0); 2 -> C (5 -> 3); 1 -> C (3 -> 2)
    assert best_fit_decreasing([5, 7, 3, 2, 4, 6, 1], 10) == [[1, 2], [5, 4], [0, 3, 6]]


def test_best_fit_prefers_the_fullest_bin_that_fits():
    # 8 opens A (room 2), 6 opens B (room 4), 3 joins B (room 1); the 1 goes to B, the tightest
    # fit, where first-fit decreasing would put it into A
    assert best_fit_decreasing([8, 6, 3, 1], 10) == [[0], [1, 2, 3]]
    assert best_fit_decreasing([], 10) == []


def test_least_loaded_fit_falls_back_to_fewest_tokens_then_leaves_over():
    lengths = [8, 6, 5, 3]
    weights = [1.0, 9.0, 1.0, 1.0]
    # 8 -> bin 0 (all empty); 6 -> bin 1 (least load 0); 5 -> least load is bin 0 (1.0) but 8+5 > 10,
    # fewest tokens is bin 1 (6) and 6+5 > 10: left over; 3 -> bin 0 (load 1 < 9), 8+3 > 10, so the
    # fewest-token bin 1: 6+3 = 9 fits
    bins, left = least_loaded_fit(range(4), lengths, weights, 2, 10)
    assert bins == [[0], [1, 3]]
    assert left == [2]


def _least_loaded_by_scans(order, lengths, weights, num_bins, capacity):
    """WLB-LLM's placement as its pseudo-code reads: scan every bin for the least weight and the
    fewest tokens (the lower bin of equals)."""
    load, tokens, bins, left = [0.0] * num_bins, [0] * num_bins, [[] for _ in range(num_bins)], []
    for item in order:
        target = min(range(num_bins), key=lambda b: (load[b], b))
        if tokens[target] + lengths[item] > capacity:
            target = min(range(num_bins), key=lambda b: (tokens[b], b))
            if tokens[target] + lengths[item] > capacity:
                left.append(item)
                continue
        bins[target].append(item)
        load[target] += weights[item]
        tokens[target] += lengths[item]
    return bins, left


@given(st.lists(st.tuples(st.integers(1, 12), st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 1e16 / 3])), max_size=60),
       st.integers(1, 9), st.integers(12, 40), st.randoms())
def test_least_loaded_fit_equals_scanning_every_bin(items, num_bins, capacity, rng):
    # few distinct weights and lengths: ties between bins are common, and zero weights leave loads equal
    lengths, weights = [n for n, _ in items], [w for _, w in items]
    order = list(range(len(items)))
    rng.shuffle(order)
    assert least_loaded_fit(order, lengths, weights, num_bins, capacity) == \
        _least_loaded_by_scans(order, lengths, weights, num_bins, capacity)


def test_smallest_count_scans_upward():
    calls = []

    def build(k):
        calls.append(k)
        return None if k in (2, 3) else k

    assert smallest_count(build, 2, 6) == 4
    assert calls == [2, 3, 4]


def test_small_at_ends_puts_the_heaviest_in_the_middle():
    order = small_at_ends([1, 2, 3, 4, 5, 6])
    assert [1 + i for i in order] == [2, 4, 6, 5, 3, 1]


def test_contiguous_cuts():
    assert contiguous_cuts([1] * 10, 3) == [range(0, 3), range(3, 7), range(7, 10)]
    # the heavy first item fills bucket 0 alone
    assert contiguous_cuts([10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 11)]
    assert contiguous_cuts([5], 3) == [range(0, 1), range(1, 1), range(1, 1)]


def test_karmarkar_karp_classic_instance():
    # LDM on {4,5,6,7,8}: 8-7 -> 1, 6-5 -> 1, then 4 against a 1 -> 3, then 3 against 1 -> 2.
    # Final difference 2 ({4,5,7} = 16 vs {6,8} = 14), although {4,5,6} / {7,8} reaches 0: the
    # textbook example of LDM not being optimal.
    weights = [4, 5, 6, 7, 8]
    parts = karmarkar_karp(weights, 2)
    assert parts == [[0, 1, 3], [2, 4]]
    assert sums(weights, parts) == [16, 14]
    # equal counts: a zero placeholder joins the first deal (0,4); (5,6); (7,8) -> same sets, 3 and 2 items
    assert karmarkar_karp(weights, 2, equal_count=True) == [[0, 1, 3], [2, 4]]


def test_karmarkar_karp_three_way():
    weights = [8, 7, 6, 5, 4, 3, 2, 1]  # total 36: a perfect 12/12/12 split exists and LDM finds it
    assert sums(weights, karmarkar_karp(weights, 3)) == [12, 12, 12]
    equal = karmarkar_karp(weights, 3, equal_count=True)
    assert sorted(len(s) for s in equal) == [2, 3, 3]


@given(st.lists(st.integers(1, 1000), max_size=40), st.integers(1, 7), st.booleans())
def test_karmarkar_karp_is_a_partition(weights, k, equal_count):
    parts = karmarkar_karp(weights, k, equal_count=equal_count)
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(weights)))
    if equal_count:
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


def spelled_out_karmarkar_karp(weights, k, equal_count):
    """The method as written in the literature: every partial solution holds all k subsets (with
    their sums, heaviest first by a stable sort, so ties keep the earlier subset first), and merging
    pairs subset j of the first with subset k-1-j of the second."""
    order = sorted(range(len(weights)), key=lambda i: (weights[i], i) if equal_count else (-weights[i], i))
    if equal_count:
        padded = [None] * (-len(order) % k) + order
        deals = [padded[s:s + k] for s in range(0, len(padded), k)]
    else:
        deals = [[i] + [None] * (k - 1) for i in order]
    partials = [[(0.0, []) if i is None else (float(weights[i]), [i]) for i in deal] for deal in deals]
    if not partials:
        return [[] for _ in range(k)]
    heap = []
    for made, subsets in enumerate(partials):
        subsets.sort(key=lambda s: s[0], reverse=True)
        heap.append((subsets[-1][0] - subsets[0][0], made, subsets))
    heapq.heapify(heap)
    made = len(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap)[2], heapq.heappop(heap)[2]
        merged = [(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)]
        merged.sort(key=lambda s: s[0], reverse=True)
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], made, merged))
        made += 1
    return [sorted(members) for _, members in heap[0][2]]


@given(st.lists(st.one_of(st.integers(1, 6), st.floats(1e-3, 1e3)), max_size=50), st.integers(1, 60), st.booleans())
def test_karmarkar_karp_matches_the_spelled_out_method(weights, k, equal_count):
    # k up to more than the items: micro-batching asks for about as many subsets as items; small
    # integer weights make ties, which must go the same way
    assert karmarkar_karp(weights, k, equal_count=equal_count) == spelled_out_karmarkar_karp(weights, k, equal_count)


def spelled_out_best_fit_decreasing(lengths, capacity):
    """Every bin scanned for each item: the least room that holds it, the lowest bin of equals."""
    bins, rooms = [], []
    for item in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fits = [(room, b) for b, room in enumerate(rooms) if room >= lengths[item]]
        if fits:
            _, target = min(fits)
        else:
            target = len(bins)
            bins.append([])
            rooms.append(capacity)
        bins[target].append(item)
        rooms[target] -= lengths[item]
    return bins


@given(st.lists(st.integers(1, 12), max_size=80), st.integers(12, 40))
def test_best_fit_decreasing_matches_the_spelled_out_method(lengths, capacity):
    # small lengths make many bins of equal room: ties must go to the lowest bin
    assert best_fit_decreasing(lengths, capacity) == spelled_out_best_fit_decreasing(lengths, capacity)


@given(st.lists(st.integers(1, 100), max_size=60))
def test_best_fit_decreasing_is_a_partition_under_capacity(lengths):
    bins = best_fit_decreasing(lengths, 100)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 100 for b in bins)
    # best fit never leaves two bins that could be merged with both at most half full
    assert sum(1 for b in bins if sum(lengths[i] for i in b) <= 50) <= 1


def test_longest_processing_time_first_by_hand_with_and_without_a_count_cap():
    from slimpack.strategies.base import lpt_assign

    # heaviest first to the least loaded bin: 9 -> 0; 8 -> 1; 3 -> 1 (8 < 9); 2 -> 0 (9 < 11); 1 -> 0 (11 = 11, lower index)
    assert lpt_assign([3, 9, 1, 8, 2], 2) == [1, 0, 0, 1, 0]
    # uncapped: 9 -> 0; 3 -> 1; 2 -> 1 (3 < 9); 1 -> 1 (5 < 9): one bin gets three of the four
    assert lpt_assign([9, 3, 2, 1], 2) == [0, 1, 1, 1]
    # at most 2 items a bin: bin 1 is full after the 2 and leaves, so the 1 goes to bin 0
    assert lpt_assign([9, 3, 2, 1], 2, most_items=2) == [0, 1, 1, 0]


@given(loads=st.lists(st.floats(0, 100), max_size=40), bins=st.integers(1, 6))
def test_a_count_cap_gives_every_bin_its_share_of_the_items(loads, bins):
    from slimpack.strategies.base import lpt_assign, members

    cap = -(-len(loads) // bins)
    owner = lpt_assign(loads, bins, most_items=cap)
    held = members(owner, bins)
    assert sorted(i for part in held for i in part) == list(range(len(loads)))
    assert all(part == [i for i, o in enumerate(owner) if o == b] for b, part in enumerate(held))
    assert all(len(part) <= cap for part in held)
    if len(loads) == cap * bins:
        assert all(len(part) == cap for part in held)
