"""Idle Chiplet Vector (ICV) golden model.

One bit per chiplet, 1 = idle.  Allocation clears the trajectory's bits (AND-NOT), release
sets the bits of chiplets that no running expert covers any more (OR).  Several completions
may arrive in one cycle: their release masks are OR-ed.  When a chiplet is released and
allocated in the same cycle the allocation wins::

    icv' = (icv | release) & ~alloc

Reset: all chiplets idle.
"""

from fsedp.params import SchedulerParams

__all__ = ["ICV"]


class ICV:
    def __init__(self, p: SchedulerParams):
        self.full = (1 << p.chiplets) - 1
        self.reset()

    def reset(self):
        self.value = self.full

    def update(self, alloc: int = 0, release: int = 0):
        self.value = ((self.value | release) & ~alloc) & self.full
        return self.value
