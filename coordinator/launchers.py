"""Which launcher a coordinator uses: Ray, none (``GRADWIRE_LAUNCHER=none``), or a clear
refusal when the worker runtime is not installed.

``pip install 'gradwire[coordinator]'`` brings neither torch nor Ray (the web process needs
neither). Such a coordinator still serves the API, the live page and external jobs (the
user's own loop trains with ``gradwire.ray.prepare`` / ``gradwire.torch.prepare`` and reports
here); a job it would have to run itself is refused at submission with a message that says
what to install (:class:`WorkerRuntimeMissing`), never a traceback at import or at launch.
Its own module so that ``coordinator.launcher`` and ``coordinator.raybridge`` (which builds on
it) need not import each other.
"""

from __future__ import annotations

import importlib.util
import sys

from coordinator.launcher import Launcher, NullLauncher
from coordinator.settings import Settings
from planning.config import TrainConfig

#: What a coordinator needs to run jobs itself, by import name.
WORKER_RUNTIME = ("ray", "torch")


def missing_worker_runtime() -> list[str]:
    """The modules of :data:`WORKER_RUNTIME` not installed here (nothing is imported)."""
    return [name for name in WORKER_RUNTIME if not _installed(name)]


def _installed(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a half-initialised module
        return False


class WorkerRuntimeMissing(NullLauncher):
    """``launcher=ray`` on an installation without Ray or torch: external jobs are accepted
    (they train elsewhere); any other job is refused at submission, naming what is missing."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        self.status = f"unavailable: {' and '.join(missing)} not installed"

    def validate(self, config: TrainConfig) -> str | None:
        if config.external:
            return None
        return (f"this coordinator cannot run jobs: {' and '.join(self.missing)} not installed (it was "
                "installed with the 'coordinator' extra only); install 'gradwire[workers]' beside it, or "
                "submit the job with external: true and train it in your own script (gradwire.ray.prepare, "
                "gradwire.torch.prepare)")


def make_launcher(settings: Settings) -> Launcher:
    """The launcher ``settings.launcher`` asks for, or :class:`WorkerRuntimeMissing`."""
    if settings.launcher == "none":
        return NullLauncher()
    missing = missing_worker_runtime()
    if missing:
        return WorkerRuntimeMissing(missing)
    from coordinator.raybridge import RayBridge

    return RayBridge(settings)
