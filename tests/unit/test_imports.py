"""Import hygiene: the compression core needs torch, the standard library and ``planning``;
``planning`` needs the standard library and pydantic, never torch.

Each check runs in a fresh interpreter, so what other tests imported does not count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

REPORT = "\nimport json, sys\nprint(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))\n"


def top_level_modules_after(code: str) -> set[str]:
    """Top-level names in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code + REPORT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_import_compressors_pulls_in_only_torch_and_the_standard_library():
    baseline = top_level_modules_after("")  # interpreter start-up (site hooks, .pth finders)
    torch_alone = top_level_modules_after("import torch")
    used = top_level_modules_after(
        "import compressors\n"
        "from compressors import build, GradientSync\n"
        "sync = GradientSync(build('acpsgd', rank=4))\n"
        "for name in ('none', 'fp16', 'bf16', 'signsgd', 'topk', 'powersgd'):\n"
        "    build(name)\n"
    )
    allowed = set(sys.stdlib_module_names) | baseline | torch_alone | {"compressors", "planning"}
    assert "torch" in torch_alone
    assert used - allowed == set(), f"compressors imported {sorted(used - allowed)}"
    # Nothing of the rest of gradwire leaks into the core.
    assert not used & {"workers", "coordinator", "benchmarks", "ray", "fastapi", "pydantic"}


def test_planning_needs_only_the_standard_library_and_pydantic():
    baseline = top_level_modules_after("")
    pydantic_alone = top_level_modules_after(  # a model with constraints pulls in pydantic's own deps
        "import pydantic, sysconfig\nsysconfig.get_config_vars()\n"
        "class M(pydantic.BaseModel):\n    x: int = pydantic.Field(1, ge=0)\n"
    )
    modules = sorted(path.stem for path in (ROOT / "planning").glob("*.py") if path.stem != "__init__")
    used = top_level_modules_after(
        "".join(f"import planning.{name}\n" for name in modules)
        + "from planning.wire import wire_bytes\n"
        "from planning.spec import make_spec\n"
        "wire_bytes(make_spec('acpsgd', rank=4), [(64, 32), (64,)], 4)\n"
    )
    allowed = set(sys.stdlib_module_names) | baseline | pydantic_alone | {"planning"}
    assert {"controller", "costmodel", "policy", "protocol", "spec", "wire"} <= set(modules)
    assert used - allowed == set(), f"planning imported {sorted(used - allowed)}"


def test_bare_package_import_is_lazy_and_torch_free():
    assert "torch" not in top_level_modules_after("import compressors")
