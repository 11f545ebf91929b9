"""Coordinator configuration: environment variables (prefix ``GRADWIRE_``) and CLI flags.

One frozen :class:`Settings` object is built at the boundary (``gradwire serve`` or a test)
and handed to :func:`coordinator.app.create_app`; nothing below reads the environment itself,
so a test can run two differently configured coordinators in one process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything the coordinator process can be told. Defaults give the embedded setup:
    SQLite under ``./.gradwire``, a local Ray head started as its own process, loopback only."""

    model_config = SettingsConfigDict(env_prefix="GRADWIRE_", frozen=True, extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8321, ge=0, le=65535)
    #: Bearer token for ``/v1``. Without one the server refuses to listen beyond loopback.
    token: SecretStr | None = None
    #: Where the SQLite file, the local Ray head's pid file and run checkpoints live.
    data_dir: Path = Path(".gradwire")
    #: SQLAlchemy URL; default ``sqlite:///<data_dir>/gradwire.db``.
    database_url: str | None = None
    #: URL the workers use to reach this coordinator; default ``http://<host>:<port>``.
    public_url: str | None = None

    #: ``ray`` runs jobs on a Ray cluster; ``none`` only records jobs (an external runner,
    #: e.g. ``gradwire train``, posts their telemetry) — used by the fast tests.
    launcher: Literal["ray", "none"] = "ray"
    #: Join this Ray cluster (``host:port`` or ``auto``); unset = start/attach the local head.
    ray_address: str | None = None
    #: GCS port of the local Ray head that ``serve`` starts when no address is given.
    ray_port: int = Field(default=6390, ge=1, le=65535)
    #: Logical CPUs the local head offers (default: this machine's CPU count, at least 2).
    ray_num_cpus: int | None = Field(default=None, ge=1, le=4096)
    ray_namespace: str = "gradwire"
    #: ``module:function`` with the signature of ``workers.runner.run_job`` (tests swap it).
    runner: str = "workers.runner:run_job"
    #: Where Ray Train keeps checkpoints; default ``<data_dir>/runs`` (must be shared storage
    #: when the cluster has more than one node).
    storage_path: str | None = None

    #: Seconds between supervisor rounds (start queued jobs, poll running ones).
    poll_interval_s: float = Field(default=0.5, gt=0, le=60)
    #: A telemetry report is kept in the history at most this often per job (downsampling).
    history_interval_s: float = Field(default=2.0, ge=0, le=3600)
    #: At most this many history rows per job; older ones are thinned out.
    history_max_rows: int = Field(default=2000, ge=10, le=1_000_000)
    #: A finished job's Prometheus series disappear this long after it ends.
    metrics_grace_s: float = Field(default=300.0, ge=0, le=86_400)
    #: How often the live event stream checks for news.
    sse_poll_s: float = Field(default=0.5, gt=0, le=30)
    #: Requests with a larger body are refused with 413 before they are parsed.
    max_body_bytes: int = Field(default=1_000_000, ge=1024)

    @field_validator("token")
    @classmethod
    def _not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        """An empty token means "none"; one of only whitespace is a mistake (a shell quoting
        slip, an unfilled template) that must not pass for a configured secret."""
        if value is None or value.get_secret_value() == "":
            return value
        secret = value.get_secret_value()
        if not secret.strip():
            raise ValueError("GRADWIRE_TOKEN is blank (only whitespace); set a real token or leave it unset")
        if secret != secret.strip():
            raise ValueError("GRADWIRE_TOKEN has leading or trailing whitespace; a bearer header cannot carry it")
        return value

    @field_validator("ray_port")
    @classmethod
    def _outside_worker_ports(cls, value: int) -> int:
        if 10002 <= value <= 19999:
            raise ValueError(f"{value} lies in Ray's worker port range 10002-19999; pick another port")
        return value

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'gradwire.db'}"

    @property
    def worker_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return (self.public_url or f"http://{host}:{self.port}").rstrip("/")

    @property
    def run_storage(self) -> str:
        return self.storage_path or str(self.data_dir.resolve() / "runs")

    @property
    def local_ray_cpus(self) -> int:
        return self.ray_num_cpus or max(2, os.cpu_count() or 2)

    @property
    def token_value(self) -> str | None:
        return self.token.get_secret_value() if self.token and self.token.get_secret_value() else None
