"""A debounced, latest-request-wins worker for the live dashboard.

Every keystroke submits a request and bumps a *generation counter*. One worker thread
waits until no newer request arrived for ``debounce_s``, computes the newest request
only, and draws the result only if its generation is still the newest one when
drawing starts (under a lock). So a newer keystroke always wins and a stale result is
never drawn over a newer one; model calls never run concurrently.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class LatestWins:
    """Run ``work(request, generation, is_current)`` for the newest submitted request.

    ``work`` does the computing and calls ``draw(generation, fn)`` (see :meth:`draw`)
    for every piece it wants shown; ``draw`` runs ``fn`` only while ``generation`` is
    the newest one. ``on_error(exc)`` receives exceptions raised by ``work``.
    """

    def __init__(self, work: Callable[[Any, int], None], on_error: Callable[[BaseException], None],
                 debounce_s: float = 0.15):
        self._work, self._on_error = work, on_error
        self.debounce_s = debounce_s
        self._cond = threading.Condition()
        self._draw_lock = threading.RLock()  # a draw that moves a control redraws from it in the same thread
        self._pending: tuple[int, Any, float] | None = None
        self._generation = 0
        self._busy = False
        self._closed = False
        self.drawn: list[int] = []  # generations in the order they were drawn (for tests)
        self._thread = threading.Thread(target=self._loop, name="icl_lens-dashboard", daemon=True)
        self._thread.start()

    @property
    def generation(self) -> int:
        return self._generation

    def submit(self, request: Any, debounce: bool = True) -> int:
        """Queue ``request`` (replacing any queued one); return its generation."""
        with self._cond:
            self._generation += 1
            ready_at = time.monotonic() + (self.debounce_s if debounce else 0.0)
            self._pending = (self._generation, request, ready_at)
            self._cond.notify_all()
            return self._generation

    def is_current(self, generation: int) -> bool:
        return generation == self._generation

    def newer_pending(self, generation: int) -> bool:
        return self._generation != generation

    def draw(self, generation: int, fn: Callable[[], None]) -> bool:
        """Run ``fn`` (which updates widgets) if ``generation`` is still the newest."""
        with self._draw_lock:
            if generation != self._generation:
                return False
            fn()
            if not self.drawn or self.drawn[-1] != generation:
                self.drawn.append(generation)
            return True

    def redraw(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a redraw from the controls, on any thread) between draws, never during one: a draw that read
        the controls before they moved finishes first, and ``fn`` then paints over it with their new values."""
        with self._draw_lock:
            fn()

    def wait_idle(self, timeout: float = 120.0) -> bool:
        """Block until nothing is queued or running (for scripts and tests)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
            return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._pending is None:
                    self._cond.wait()
                if self._closed:
                    return
                # Debounce: wait until the newest request is due (a newer one resets it).
                while self._pending is not None and time.monotonic() < self._pending[2]:
                    self._cond.wait(max(0.0, self._pending[2] - time.monotonic()))
                if self._pending is None:
                    continue
                generation, request, _ = self._pending
                self._pending = None
                self._busy = True
            try:
                self._work(request, generation)
            except BaseException as exc:  # noqa: BLE001 - shown in the status line, never lost
                try:
                    self._on_error(exc)
                except BaseException:  # noqa: BLE001
                    pass
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
