"""Progress lines for long loops that end with their final count, live or saved.

`tqdm.auto` in a notebook draws an ipywidgets bar. A notebook saved after a headless run
(papermill, nbclient, the grader) keeps only the bar's text as it was when it was *first*
displayed, `0/21`, frozen at 0% beside the results of the work it counted (w2-03, shared
finding). `progress()` draws a line of text instead, in place, through IPython's display
updates, which a live JupyterLab shows as it moves and a headless run saves as it ends:
`ceiling: 100%|##########| 21/21 [00:03<00:00, 6.52it/s]`. Outside a notebook (a script, CI's
log) it is tqdm's own bar on stderr, left in place at the end. The training loop
(`course_utils.train.train`, lesson 01) and lesson 02's sweeps use it.
"""
from __future__ import annotations

import sys
import time
import uuid

__all__ = ["Progress", "progress"]


def _in_a_notebook() -> bool:
    """Whether this process is a Jupyter kernel (a live or a headless notebook)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class Progress:
    """A progress line: `update(n)`, `close()` (or a `with` block, or iterate over it). The
    line is redrawn at most every `mininterval` seconds while it runs, and always at `close()`,
    so the last thing it shows is the final count. `total` may be None (a count, no bar)."""

    def __init__(self, iterable=None, total: int | None = None, desc: str = "", mininterval: float = 0.5,
                 unit: str = "it"):
        if total is None and iterable is not None:
            try:
                total = len(iterable)
            except TypeError:
                total = None
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.mininterval, self.n, self.closed = mininterval, 0, False
        self._t0 = self._drawn = time.perf_counter()
        self._bar, self._display_id = None, None
        if _in_a_notebook():
            from IPython.display import display
            self._display_id = uuid.uuid4().hex
            display({"text/plain": self.line()}, raw=True, display_id=self._display_id)
        else:
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=desc, leave=True, mininterval=mininterval, unit=unit, file=sys.stderr)

    def line(self) -> str:
        """The progress line as it stands (tqdm's format)."""
        from tqdm import tqdm
        return tqdm.format_meter(self.n, self.total, time.perf_counter() - self._t0, prefix=self.desc,
                                 unit=self.unit, ncols=max(90, len(self.desc) + 60))   # w10-03: a long desc
                                                                                     # left no room for bar or rate

    def _draw(self) -> None:
        if self._display_id is not None:
            from IPython.display import update_display
            update_display({"text/plain": self.line()}, raw=True, display_id=self._display_id)
        self._drawn = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif time.perf_counter() - self._drawn >= self.mininterval:
            self._draw()

    def close(self) -> None:
        """Draw the final count (once; later calls do nothing)."""
        if self.closed:
            return
        self.closed = True
        if self._bar is not None:
            self._bar.close()
        else:
            self._draw()

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress(iterable=None, *, total: int | None = None, desc: str = "", mininterval: float = 0.5) -> Progress:
    """`for x in progress(items, desc="sweep"):` or `bar = progress(total=n, desc=...)`: a
    progress line that ends showing its final count, in a live notebook, a saved one and a log."""
    return Progress(iterable, total=total, desc=desc, mininterval=mininterval)
