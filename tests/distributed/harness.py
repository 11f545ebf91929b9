"""Run a function on N real processes joined by a real gloo process group.

Each rank's return value is saved with torch.save and handed back to the test in rank
order. A rank that raises makes ``run_ranks`` raise with that rank's traceback; a rank
that hangs past ``timeout`` is killed and reported, so a broken collective cannot hang CI.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, out_dir: str, fn: Callable[..., Any], args: tuple,
           teardown: bool) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    try:
        value = fn(rank, world_size, *args)
        torch.save({"ok": True, "value": value}, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()
        if not teardown:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    except BaseException:
        torch.save({"ok": False, "error": traceback.format_exc()}, Path(out_dir) / f"rank{rank}.pt")
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 180.0,
              teardown: bool = True) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return their values.

    ``teardown=False``: once every rank has saved its value, each exits at once, without
    destroying its process groups. For a scenario that lets a gloo collective time out on
    purpose: gloo cannot tear down a group whose pair timed out, and aborts the process
    (``terminate called after throwing gloo::IoException: Timed out waiting ... for recv``,
    or ``terminate called without an active exception``) in roughly one run in twenty.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(
            _entry, args=(world_size, free_port(), out_dir, fn, args, teardown), nprocs=world_size, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    raise TimeoutError(f"ranks did not finish within {timeout:.0f} s (a hang)")
        except mp.ProcessExitedException as exc:
            errors = []
            for rank in range(world_size):
                path = Path(out_dir) / f"rank{rank}.pt"
                if path.exists():
                    record = torch.load(path, weights_only=False)
                    if not record["ok"]:
                        errors.append(f"rank {rank}:\n{record['error']}")
            raise RuntimeError("\n".join(errors) or str(exc)) from exc
        results = []
        for rank in range(world_size):
            record = torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=False)
            results.append(record["value"])
        return results
