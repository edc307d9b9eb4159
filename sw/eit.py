"""Expert Information Table (EIT) golden model.

The EIT keeps one entry per (request, expert): the trajectory mask (chiplets that hold at
least one token of that request activating the expert) and the token count.  Keeping the
request dimension (one SRAM bank per request) is what lets Algorithm 2 take a deferred
request's tokens out of the layer: the merged, per-expert view that the sorter and matcher
see is formed by a scan that includes only the requests that were not deferred.

Counts saturate at ``2**count_width - 1``; a saturating increment or a saturating merged sum
sets the sticky ``overflow`` flag (cleared when a new round starts).  A record whose request,
chiplet or expert id is out of range is dropped and sets the sticky ``bad_record`` flag.
"""

from dataclasses import dataclass

from fsedp.params import SchedulerParams

__all__ = ["GateRecord", "ScanResult", "EIT"]


@dataclass(frozen=True)
class GateRecord:
    """One gate result: token on ``chiplet``, belonging to ``request``, activating ``expert``.

    A token with top-k experts yields k records.
    """

    request: int
    chiplet: int
    expert: int


@dataclass(frozen=True)
class ScanResult:
    count: int  # saturating sum of the included requests' counts
    mask: int  # OR of the included requests' trajectory masks
    present: int  # bit r set when request r has at least one token on this expert


class EIT:
    def __init__(self, p: SchedulerParams):
        self.p = p
        self.reset()

    def reset(self):
        self.mask = [[0] * self.p.experts for _ in range(self.p.requests)]
        self.count = [[0] * self.p.experts for _ in range(self.p.requests)]
        self.clear_flags()

    def clear_flags(self):
        """Clear the sticky flags (a new round starts).  ``saturated`` says which counts set
        ``overflow``: ``"entry"`` (a request's count at its width) and/or ``"sum"`` (a merged
        count)."""
        self.overflow = False
        self.bad_record = False
        self.saturated: set[str] = set()

    def valid(self, rec: GateRecord) -> bool:
        p = self.p
        return (
            0 <= rec.request < p.requests
            and 0 <= rec.chiplet < p.chiplets
            and 0 <= rec.expert < p.experts
        )

    def write(self, rec: GateRecord):
        """Accumulate one gate record (RTL: read-modify-write of bank ``request``)."""
        if not self.valid(rec):
            self.bad_record = True
            return
        r, e = rec.request, rec.expert
        self.mask[r][e] |= 1 << rec.chiplet
        if self.count[r][e] == self.p.count_max:
            self.overflow = True
            self.saturated.add("entry")
        else:
            self.count[r][e] += 1

    def write_many(self, records):
        """:meth:`write` of every record in order (the same result, fewer lookups)."""
        p = self.p
        nr, nc, ne, cmax = p.requests, p.chiplets, p.experts, p.count_max
        mask, count = self.mask, self.count
        for rec in records:
            if isinstance(rec, GateRecord):
                r, c, e = rec.request, rec.chiplet, rec.expert
            else:
                r, c, e = rec
            if not (0 <= r < nr and 0 <= c < nc and 0 <= e < ne):
                self.bad_record = True
                continue
            mask[r][e] |= 1 << c
            if count[r][e] == cmax:
                self.overflow = True
                self.saturated.add("entry")
            else:
                count[r][e] += 1

    def merged(self, include: int, clear: bool = False) -> tuple[list, list, list]:
        """:meth:`scan` of every expert at once: ``(counts, masks, present)``, one list
        entry per expert, with the same saturation and ``overflow`` (and with ``clear``
        every request's entries zeroed).  Visits only the non-zero entries, so a round
        costs its records, not the table; ``tests/test_golden.py`` shows it equal to the
        per-expert scans."""
        p = self.p
        counts, masks, present = [0] * p.experts, [0] * p.experts, [0] * p.experts
        for r in range(p.requests):
            row, mrow, bit = self.count[r], self.mask[r], 1 << r
            live = [e for e, c in enumerate(row) if c]
            if include >> r & 1:
                for e in live:
                    present[e] |= bit
                    counts[e] += row[e]
                    masks[e] |= mrow[e]
            else:
                for e in live:
                    present[e] |= bit
            if clear and live:
                for e in live:
                    row[e] = 0
                    mrow[e] = 0
        cmax = p.count_max
        for e, c in enumerate(counts):
            if c > cmax:
                counts[e] = cmax
                self.overflow = True
                self.saturated.add("sum")
        return counts, masks, present

    def scan(self, expert: int, include: int, clear: bool = False) -> ScanResult:
        """Merged view of ``expert`` over the requests in bit-mask ``include``.

        With ``clear`` the entries are zeroed after the read (pass 2 of a round).
        """
        total, mask, present = 0, 0, 0
        for r in range(self.p.requests):
            c = self.count[r][expert]
            if c:
                present |= 1 << r
            if include >> r & 1:
                total += c
                mask |= self.mask[r][expert]
            if clear:
                self.count[r][expert] = 0
                self.mask[r][expert] = 0
        if total > self.p.count_max:
            total = self.p.count_max
            self.overflow = True
            self.saturated.add("sum")
        return ScanResult(total, mask, present)
