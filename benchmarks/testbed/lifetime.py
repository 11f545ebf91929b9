"""Live testbeds are removed on exit and on SIGTERM, not only by their with-block.
"""

from __future__ import annotations

import atexit
import signal
import threading
from typing import Protocol


class Closable(Protocol):
    """What is tracked here: a testbed, by what removes it (kept apart so nothing here imports the testbed)."""

    def close(self) -> None: ...

# --------------------------------------------------------------------------- lifetime hooks

_LIVE: set[Closable] = set()
_LIVE_LOCK = threading.Lock()
_ATEXIT_DONE = False
_PREV_SIGTERM: object = None


def _on_sigterm(signum: int, frame: object) -> None:
    """Turn SIGTERM into SystemExit so with-blocks unwind and remove their testbeds."""
    raise SystemExit(128 + signum)


def _close_all() -> None:
    for tb in list(_LIVE):
        tb.close()


def register(tb: Closable) -> None:
    """Track a live testbed; the first one installs the atexit and SIGTERM hooks."""
    global _ATEXIT_DONE, _PREV_SIGTERM
    with _LIVE_LOCK:
        if not _ATEXIT_DONE:
            atexit.register(_close_all)
            _ATEXIT_DONE = True
        if not _LIVE and threading.current_thread() is threading.main_thread():
            # Only replace the default action: a program with its own SIGTERM handler
            # presumably exits cleanly, and atexit covers that path.
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
                _PREV_SIGTERM = signal.SIG_DFL
        _LIVE.add(tb)


def unregister(tb: Closable) -> None:
    global _PREV_SIGTERM
    with _LIVE_LOCK:
        _LIVE.discard(tb)
        if not _LIVE and _PREV_SIGTERM is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == _on_sigterm:
                signal.signal(signal.SIGTERM, _PREV_SIGTERM)  # type: ignore[arg-type]
            _PREV_SIGTERM = None


