"""Merging the parts into the results file, in the dataset's order, a window at a time.

Parts hold records in the order rows finished; the file holds them in the dataset's
(`RowOrder`). Concatenating every part and sorting the whole took 1,000,000 records
(~300 MB of Arrow) to a 1.1 GB peak: the parts, their concatenation, the sorted copy
and the writer's buffers at once. Here only the sort keys are read whole (four small
columns: ~25 MB for a million records); each record's place follows from them, and the
file is written a window of places at a time, from the parts holding them. A part is
read once, when the first of its records is due, and let go after its last: rows end
nearly in their order, so few parts are held at once (all of them, as before, only if
the rows ended in no order at all).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from patronus_tasks.record.location import Location

#: The columns a record's place is found from.
KEY_COLUMNS = ["sid", "repeat", "link_index", "evaluator_name"]
#: A window's size: up to this many records (the file's row groups), about this many bytes.
WINDOW_ROWS, WINDOW_BYTES = 65_536, 64 << 20
#: The first window's, before the records' size is known; the smallest.
FIRST_WINDOW_ROWS, MIN_WINDOW_ROWS = 4096, 256


@dataclass(frozen=True)
class RowOrder:
    """The order records are kept in: the dataset's rows (``sids``), then repeat, then chain
    link, then the link's evaluators in the order given (``evaluators``: (link, name)), the
    task's own record (no evaluator) first. Records of a sid the dataset lacks go last,
    by sid: a sid's records are always together (`spans_file` counts on it)."""

    sids: Sequence[str]
    evaluators: Sequence[tuple[int, str]] = ()

    def sort_indices(self, keys: pa.Table) -> pa.Array:
        """The records of ``keys`` (the `KEY_COLUMNS`), as indices in this order (records
        of one place as they came)."""
        evaluators = pa.array([f"{link}\x00{name}" for link, name in self.evaluators], pa.string())
        named = pc.binary_join_element_wise(pc.cast(keys["link_index"], pa.string()),
                                            keys["evaluator_name"], "\x00")
        sids = pa.array(self.sids, pa.string())
        ranks = pa.table({
            "row": pc.fill_null(pc.index_in(keys["sid"], value_set=sids), len(self.sids)),
            "sid": keys["sid"], "repeat": pc.fill_null(keys["repeat"], 0), "link": keys["link_index"],
            "evaluator": pc.fill_null(pc.index_in(named, value_set=evaluators), -1)})
        return pc.sort_indices(ranks, sort_keys=[(c, "ascending") for c in ranks.column_names])


@dataclass
class _Part:
    """A part's records sorted by their places in the file (``places``, ascending)."""

    table: pa.Table
    places: np.ndarray

    def between(self, start: int, end: int) -> tuple[pa.Table, np.ndarray]:
        lo, hi = np.searchsorted(self.places, [start, end])
        return self.table.slice(lo, hi - lo), self.places[lo:hi]


def places(parts: Sequence[Location], order: RowOrder | None) -> list[np.ndarray]:
    """Each part's records' places in the file (their order: the parts' own without one)."""
    keys = [p.read_table(columns=KEY_COLUMNS) for p in parts]
    sizes = [len(k) for k in keys]
    if order is None or not parts:
        place = np.arange(sum(sizes))
    else:
        ranked = order.sort_indices(pa.concat_tables(keys)).to_numpy()
        place = np.empty(len(ranked), np.int64)
        place[ranked] = np.arange(len(ranked))
    starts = np.cumsum([0, *sizes])
    return [place[a:b] for a, b in itertools.pairwise(starts)]


def merged(parts: Sequence[Location], read: Callable[[Location], pa.Table],
           order: RowOrder | None) -> Iterator[pa.Table]:
    """The parts' records in ``order``, a window at a time (``read``: a part whole)."""
    where = places(parts, order)
    first = sorted((int(w.min()), i) for i, w in enumerate(where) if len(w))
    last = {i: int(where[i].max()) for _, i in first}
    total, start, size, due = sum(len(w) for w in where), 0, FIRST_WINDOW_ROWS, 0
    held: dict[int, _Part] = {}
    while start < total:
        end = min(total, start + size)
        while due < len(first) and first[due][0] < end:
            i = first[due][1]
            sort = np.argsort(where[i], kind="stable")
            held[i] = _Part(read(parts[i]).take(sort), where[i][sort])
            due += 1
        window = _window(held, start, end)
        for i in [i for i in held if last[i] < end]:
            del held[i]
        yield window
        size = max(MIN_WINDOW_ROWS, min(WINDOW_ROWS, WINDOW_BYTES * len(window)
                                        // max(1, window.nbytes)))
        start = end


def _window(held: dict[int, _Part], start: int, end: int) -> pa.Table:
    """The records of places ``start`` to ``end`` (each place is one record's)."""
    pieces = [held[i].between(start, end) for i in sorted(held)]
    pieces = [(t, p) for t, p in pieces if len(t)]
    table = pa.concat_tables([t for t, _ in pieces])
    return table.take(np.argsort(np.concatenate([p for _, p in pieces]), kind="stable"))
