"""Telemetry out, decisions in, and agreement on the step where every rank switches.

- A :class:`TelemetrySink` takes rank 0's reports: the coordinator over HTTP, a Ray actor
  (``gradwire train``'s live progress) or a plain list (tests, ``--no-ray``).
- A :class:`DecisionSource` says which compressor should be in force: the in-process
  adaptive policy (no coordinator) or the coordinator over HTTP. A source that fails or is
  unreachable never stops training: the last decision stays in force.
- :class:`SwitchAgreement`: every ``sync_every`` steps rank 0 broadcasts (decision version,
  compressor, parameters, probe-now) in one tiny collective, so every rank switches at the
  same step and probes the link together. Each rank keeps its own record of what was in
  force from which step, which tests read back.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch.distributed as dist

from planning.controller import AdaptiveController
from planning.decision import Decision
from planning.protocol import Telemetry
from planning.sections import CompressionConfig
from workers.probe import LinkRequest

log = logging.getLogger(__name__)


class TelemetrySink(Protocol):
    def send(self, telemetry: Telemetry) -> None: ...

    def close(self) -> None: ...


class DecisionSource(Protocol):
    def current(self) -> Decision | None:
        """The latest decision known (never blocks on the network)."""

    def observe(self, telemetry: Telemetry) -> None:
        """Telemetry rank 0 just produced (an in-process policy decides from it)."""


# --------------------------------------------------------------------------- sinks


class ListSink:
    """Keeps every report in memory; for tests and single-process runs."""

    def __init__(self) -> None:
        self.reports: list[Telemetry] = []

    def send(self, telemetry: Telemetry) -> None:
        self.reports.append(telemetry)

    def close(self) -> None:
        pass


class CallbackSink:
    """Hands each report to a function (a Ray actor's ``push.remote``, a queue's ``put``)."""

    def __init__(self, callback: Callable[[dict[str, Any]], Any]) -> None:
        self._callback = callback

    def send(self, telemetry: Telemetry) -> None:
        try:
            self._callback(telemetry.model_dump(mode="json"))
        except Exception:  # noqa: BLE001 - progress display must never stop training
            log.warning("progress sink failed", exc_info=True)

    def close(self) -> None:
        pass


class CoordinatorClient:
    """Rank 0's link to the coordinator: posts telemetry, fetches decisions, in the background.

    Posting never blocks the training loop: reports go into a one-slot queue (the newest
    wins) and a thread sends them, retrying with exponential backoff while the coordinator
    is unreachable. The same thread polls ``GET .../decision``; ``current()`` returns the
    last decision it got.
    """

    def __init__(self, base_url: str, job_id: str, token: str | None, *, poll_s: float = 1.0, timeout_s: float = 5.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self._job = job_id
        self._poll_s = poll_s
        self._outbox: queue.Queue[Telemetry] = queue.Queue(maxsize=1)
        self._decision: Decision | None = None
        self._stop = threading.Event()
        self._backoff_s = 0.0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="gradwire-coordinator-client", daemon=True)
        self._thread.start()

    # sink
    def send(self, telemetry: Telemetry) -> None:
        while True:  # the sender thread may refill the slot between our get and put
            try:
                self._outbox.put_nowait(telemetry)
                return
            except queue.Full:
                try:
                    self._outbox.get_nowait()  # drop an unsent older report: the newest one matters
                except queue.Empty:
                    pass

    # source
    def current(self) -> Decision | None:
        return self._decision

    def observe(self, telemetry: Telemetry) -> None:
        pass  # the coordinator decides from the telemetry it receives

    def close(self, flush_s: float = 5.0) -> None:
        """Stop, after up to ``flush_s`` for the thread to take the last report (the final
        report tells the coordinator a run ended, when nothing else will)."""
        deadline = time.monotonic() + flush_s
        while not self._outbox.empty() and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stop.set()
        self._thread.join(timeout=10)
        self._client.close()

    def _run(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            try:
                report = self._outbox.get(timeout=min(self._poll_s, 0.2))
            except queue.Empty:
                report = None
            if self._backoff_s and self._stop.wait(self._backoff_s):
                break
            try:
                if report is not None:
                    response = self._client.post(f"/v1/jobs/{self._job}/telemetry", json=report.model_dump(mode="json"))
                    response.raise_for_status()
                if time.monotonic() >= next_poll:
                    response = self._client.get(f"/v1/jobs/{self._job}/decision")
                    if response.status_code == 200:
                        self._decision = Decision.model_validate(response.json())
                    next_poll = time.monotonic() + self._poll_s
                self._backoff_s = 0.0
            except Exception as exc:  # noqa: BLE001 - unreachable coordinator: keep training
                self.failures += 1
                self._backoff_s = min(30.0, max(0.5, self._backoff_s * 2))
                log.warning("coordinator unreachable (%s); retrying in %.1f s", exc, self._backoff_s)
                if report is not None:  # retry it, unless a newer report came in meanwhile
                    try:
                        self._outbox.put_nowait(report)
                    except queue.Full:
                        pass


# --------------------------------------------------------------------------- sources


class FixedDecision:
    """Keeps the job's configured compressor (compression mode 'fixed')."""

    def __init__(self, decision: Decision) -> None:
        self._decision = decision

    def current(self) -> Decision | None:
        return self._decision

    def observe(self, telemetry: Telemetry) -> None:
        pass


class InProcessPolicy:
    """The adaptive policy run on rank 0 itself, when there is no coordinator: the same
    :class:`~planning.controller.AdaptiveController` the coordinator holds per job, on this
    process's clock; ``initial`` is the decision in force (a resumed run's, from its checkpoint)."""

    def __init__(self, compression: CompressionConfig, initial: Decision | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.controller = AdaptiveController(compression, current=initial)
        self._clock = clock

    @property
    def evaluations(self) -> int:
        """Reports on which the policy itself ran (had a profile and a bandwidth)."""
        return self.controller.evaluations

    @property
    def last_reason(self) -> str:
        """Why the policy chose what it chose the last time; the run summary shows it."""
        return self.controller.last_reason

    def current(self) -> Decision | None:
        return self.controller.decision

    def observe(self, telemetry: Telemetry) -> None:
        try:
            decision = self.controller.observe(telemetry, self._clock())
        except Exception:  # noqa: BLE001 - a policy bug must not stop training
            log.exception("adaptive policy failed; keeping the current decision")
            return
        if decision is not None:
            log.info("policy: switch to %s (%s)", decision.compressor, decision.reason)


# --------------------------------------------------------------------------- agreement


@dataclass(frozen=True)
class Applied:
    """One entry of a rank's own record: from ``step`` on, ``decision`` was in force."""

    step: int
    version: int
    compressor: str
    params: dict[str, Any]


#: An adaptive job's agreement is due at every step of its first this many cycles until the
#: policy's first decision is applied (:attr:`SwitchAgreement.eager_until`).
EAGER_CYCLES = 2


@dataclass
class SwitchAgreement:
    """Rank 0's choice, broadcast every ``sync_every`` steps; all ranks act on the same step."""

    sync_every: int
    group: dist.ProcessGroup | None = None
    version: int = -1
    history: list[Applied] = field(default_factory=list)
    #: Before this step, and while the decision in force is ``eager_version`` (at the start the
    #: job's initial one, version 0), the agreement is due at every step, so the policy's next
    #: decision applies at the step after it is made rather than at the next multiple of
    #: ``sync_every``.
    #:
    #: Why at the start: an adaptive job starts on its configured choice and the policy can
    #: decide only once a few steps are timed (the model profile needs three). On the
    #: benchmark's 50 Mbit/s link the first decision came with step 3's report and applied at
    #: step 5: the start choice (``none``, 0.12 s a step there against PowerSGD r4's 0.03 s) ran
    #: steps 4 and 5 for nothing, and those first five steps were the whole of the adaptive
    #: run's 0.37 s gap to the fixed PowerSGD r4 at step 255 (its steps 5-255 took 1.01x the
    #: fixed run's; session 25). After a drop of the link (:meth:`link_dropped`) likewise.
    #: The extra exchanges are a tiny broadcast each, carry the decision alone (no link
    #: request: the probes keep the schedule of the regular exchanges) and end with the next
    #: decision.
    eager_until: int = 0
    eager_version: int = 0
    #: Whether a drop of the link makes the exchanges eager until the next regular one (an
    #: adaptive job's: a fixed job's decision never changes).
    eager_after_drop: bool = False
    #: The regular exchanges that read a drop of the link (the run summary shows them).
    drops: list[int] = field(default_factory=list)

    @classmethod
    def for_job(cls, compression: CompressionConfig, group: dist.ProcessGroup | None = None) -> "SwitchAgreement":
        """The agreement of a job with these compression settings (eager at its start and after
        a drop of the link when adaptive)."""
        adaptive = compression.mode == "adaptive"
        eager = EAGER_CYCLES * compression.sync_every if adaptive else 0
        return cls(compression.sync_every, group=group, eager_until=eager, eager_after_drop=adaptive)

    def due(self, step: int) -> bool:
        """Whether every rank exchanges before ``step`` (the same answer on every rank: it
        depends on the step and on the version they agreed on)."""
        return self.regular(step) or (self.version == self.eager_version and step < self.eager_until)

    def link_dropped(self, step: int) -> None:
        """Every rank, when the regular exchange at ``step`` read a drop of the link
        (``workers.reporter.Reporter.exchange``, the same answer on every rank): due at every
        step until the next regular exchange or the next decision, whichever comes first.

        Why: the policy decides on the report rank 0 sends after this step (it takes a drop
        the workers read as a level at once: ``planning.link_smoothing.fold_sample``; a
        coordinator's decision comes a poll later); at the next regular exchange it would apply after up to
        ``sync_every - 1`` more steps on a choice priced for the fast link. On the benchmark's
        50 Mbit/s link a cast costs ~0.028 s a step more than PowerSGD r4, and the policy's lag
        from a drop to the switch was 10-15 steps (sessions 28-29)."""
        self.drops.append(step)
        if self.eager_after_drop:
            self.eager_until = step + self.sync_every - step % self.sync_every
            self.eager_version = self.version

    def regular(self, step: int) -> bool:
        """Whether ``step`` is one of the every-``sync_every`` exchanges, where the quality
        figures and the link's reading are exchanged too (``workers.reporter.Reporter.exchange``)."""
        return step % self.sync_every == 0

    def exchange(self, step: int, proposal: Decision | None,
                 link_request: LinkRequest | None) -> tuple[Decision | None, LinkRequest | None]:
        """Collective. Rank 0's (decision, link request) reach every rank.

        Returns the decision to apply *before* ``step`` if it is newer than the one in force
        (else None), and rank 0's request to measure the link (a probe or a check, None for
        neither; every rank must measure alike).
        """
        message: list[Any] = [None]
        if dist.get_rank() == 0:
            message[0] = (proposal.model_dump() if proposal is not None else None, link_request)
        if dist.get_world_size() > 1:
            dist.broadcast_object_list(message, src=0, group=self.group)
        payload, probe = message[0]
        if payload is None:
            return None, probe
        decision = Decision.model_validate(payload)
        if decision.version <= self.version:
            return None, probe
        self.version = decision.version
        self.history.append(Applied(step=step, version=decision.version, compressor=decision.compressor, params=decision.params))
        return decision, probe
