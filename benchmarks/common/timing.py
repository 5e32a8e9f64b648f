"""Timings taken in turns: each round times every contender once, the order rotating from
round to round, so a slow phase of a shared, noisy machine hits all of them alike; ratios are
taken round by round, then their median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def rotated(names: Sequence[str], round_no: int) -> list[str]:
    """``names`` in round ``round_no``'s order: who went first moves to the back each round
    (for two names: alternating)."""
    shift = round_no % len(names)
    return [*names[shift:], *names[:shift]]


def interleaved_seconds(
    actions: dict[str, Callable[[int], object]], rounds: int, warmup: int = 0
) -> dict[str, list[float]]:
    """Seconds each action took in each of ``rounds`` timed rounds, after ``warmup`` untimed
    ones. Each call gets its round's index (warm-up rounds first), e.g. to pick its batch."""
    names = list(actions)
    for round_no in range(warmup):
        for name in rotated(names, round_no):
            actions[name](round_no)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(rounds):
        for name in rotated(names, round_no):
            start = time.perf_counter()
            actions[name](warmup + round_no)
            seconds[name].append(time.perf_counter() - start)
    return seconds


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the per-round ratios (robust to a round the machine was busy in)."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))
