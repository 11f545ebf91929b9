"""The web process must stay free of torch (and Ray until the launcher needs it)."""

import subprocess
import sys

from support.servers import REPO_ROOT


def test_importing_the_app_and_cli_pulls_in_neither_torch_nor_ray():
    code = ("import sys, coordinator.app, coordinator.cli, coordinator.launcher; "
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
