"""Which rows to review (``select=``), capped at ``n``:

- ``"disagreements"``: rows a panel's judges split on, in the file's order;
- ``"uncertain"``: rows whose probability of a pass (from the judge's log-probabilities,
  where the endpoint gave them) lies between ``bounds``, the nearest to a coin toss first;
- ``"failed"``: rows the judge failed, in the file's order;
- ``"sample"``: a random sample of ``n`` (seeded), stratified by the judge's answer: each
  answer's share of the sample is its share of the rows (at least one row of each);
- a function of the row (a `Reviewable`): the rows it says yes to.

The same call selects the same rows (the order and the seed fixed), so a review that
goes on later, or runs again after a suspended flow run is resumed, asks about the rows
it asked about before; rows labelled already are then left out (`pending`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.review.rows import Reviewable

SELECTIONS = ("disagreements", "uncertain", "failed", "sample")
Select = str | Callable[[Reviewable], Any]


@dataclass(frozen=True)
class Chosen:
    """The rows selected, and why some were not (said when none match)."""

    rows: list[Reviewable]
    why_none: str = ""


def _natural(sid: str) -> str:
    return re.sub(r"\d+", lambda m: m.group().zfill(12), sid)


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """How many of ``n`` to draw from each stratum: one of each while ``n`` allows, the
    rest in proportion to their sizes (largest remainders), none past a stratum's size."""
    n = min(n, sum(sizes.values()))
    counts = {k: 1 if n >= len(sizes) else 0 for k in sizes}
    left = n - sum(counts.values())
    room = {k: sizes[k] - counts[k] for k in sizes}
    quota = {k: left * room[k] / max(sum(room.values()), 1) for k in sizes}
    for k in sizes:
        counts[k] += min(int(quota[k]), room[k])
    order = sorted(sizes, key=lambda k: (-(quota[k] - int(quota[k])), -sizes[k], k))
    while sum(counts.values()) < n:
        k = next(k for k in order if counts[k] < sizes[k])
        counts[k] += 1
        order.append(order.pop(order.index(k)))  # each in turn, the largest remainders first
    return counts


def stratified(rows: Sequence[Reviewable], n: int, seed: int) -> list[Reviewable]:
    """``n`` rows at random (``seed``), as many of each answer as `allocate` says, in
    the file's order."""
    strata: dict[str, list[Reviewable]] = {}
    for r in sorted(rows, key=lambda r: _natural(r.sid)):
        strata.setdefault(str(r.verdict), []).append(r)
    counts = allocate({k: len(v) for k, v in strata.items()}, n)
    rng = random.Random(seed)
    picked = {id(r) for k in sorted(strata) for r in rng.sample(strata[k], counts[k])}
    return [r for r in rows if id(r) in picked]


def _uncertain(rows: Sequence[Reviewable], bounds: tuple[float, float]) -> Chosen:
    low, high = bounds
    if not 0 <= low < high <= 1:
        raise ConfigError(f"review: bounds must be two probabilities, low < high, such as (0.2, 0.8); "
                          f"not {bounds!r}.")
    known = [r for r in rows if r.p_pass is not None]
    found = sorted((r for r in known if low <= (r.p_pass or 0) <= high),
                   key=lambda r: round(abs((r.p_pass or 0) - 0.5), 6))  # ties: file order
    if not known:
        return Chosen([], "no row has a probability of a pass: the judge's endpoint gave no "
                          "log-probabilities (or the judge is not a pass/fail one)")
    return Chosen(found, f"no row's probability of a pass is between {low:g} and {high:g} "
                         f"({len(known)} rows have one)")


def choose(rows: Sequence[Reviewable], select: Select, n: int, seed: int = 0,
           bounds: tuple[float, float] = (0.2, 0.8)) -> Chosen:
    """The rows ``select`` picks among ``rows``, at most ``n`` (see the module)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"review: n must be a number of rows, 1 or more, not {n!r}.")
    if callable(select):
        found = Chosen([r for r in rows if select(r)], "the select function said no to every row")
    elif select == "sample":
        found = Chosen(stratified(rows, n, seed), "the evaluator has no scored row")
    elif select == "failed":
        found = Chosen([r for r in rows if r.passed is False], "the judge failed no row")
    elif select == "disagreements":
        panel = any(r.judges for r in rows)
        found = Chosen([r for r in rows if r.split], "the panel's judges agree on every row" if panel
                       else "the evaluator is no panel of judges (judges=[...]): none to disagree")
    elif select == "uncertain":
        found = _uncertain(rows, bounds)
    else:
        raise ConfigError(f"review: select must be one of {', '.join(SELECTIONS)} or a function of "
                          f"the row, not {select!r}.")
    return Chosen(found.rows[:n], found.why_none)


def pending(rows: Sequence[Reviewable], per_row: int = 1) -> list[Reviewable]:
    """The rows fewer than ``per_row`` people labelled yet."""
    return [r for r in rows if len(set(r.reviewers)) < per_row]
