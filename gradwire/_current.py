"""The session of this process (one per training process), shared by ``gradwire.ray`` and
``gradwire.torch`` so that ``step`` needs no handle."""

from __future__ import annotations

from typing import Any

_session: Any | None = None


def set_current(session: Any) -> Any:
    global _session
    if _session is not None:
        _session.close()  # a second prepare() in one process (a restarted loop) replaces the first
    _session = session
    return session


def current() -> Any:
    """The :class:`workers.session.TrainingSession` of this process; raises if there is none."""
    if _session is None:
        raise RuntimeError("gradwire: no session in this process; call gradwire.ray.prepare(model) "
                           "or gradwire.torch.prepare(model) first")
    return _session


def step(loss: Any = None) -> None:
    """End one training step: call on every rank after ``optimizer.step()``, with the loss."""
    current().step(loss)


def close() -> None:
    """Send the last report and stop timing (also done by itself after ``steps`` steps)."""
    if _session is not None:
        _session.close()
