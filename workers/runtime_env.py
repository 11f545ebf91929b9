"""A job's ``runtime_env`` as Ray takes it from a process that is not the job's driver.

Ray accepts local ``working_dir``/``py_modules`` paths only in a job-level runtime_env
(``ray.init``); an actor or a task started with one needs URIs. :func:`uploaded` does for
them what ``ray.init`` does for a job, with Ray's own upload functions (content-addressed:
an unchanged directory is uploaded once). Torch-free: the coordinator's launcher uses it.
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any

log = logging.getLogger(__name__)


def uploaded(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with local working_dir/py_modules replaced by ``gcs://`` URIs (remote
    URIs are kept). Needs a connected Ray."""
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    scratch = tempfile.gettempdir()
    env = upload_py_modules_if_needed(dict(runtime_env), include_gitignore=True, scratch_dir=scratch, logger=log)
    env = upload_working_dir_if_needed(env, include_gitignore=True, scratch_dir=scratch, logger=log)
    env.pop("excludes", None)
    return env


def inherited_code() -> bool:
    """True when this Ray process already runs with a working_dir or py_modules (it is the
    job's runner actor, or a driver whose ``ray.init`` got the job's runtime_env): its
    children inherit them, so nothing needs uploading again."""
    import ray

    current = ray.get_runtime_context().runtime_env or {}
    return bool(current.get("working_dir") or current.get("py_modules"))
