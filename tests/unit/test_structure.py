"""The project's structure, checked statically (``tests/support/structure.py``): no import
cycle among its modules, imports inside functions included, and each compressor's name
written in code in at most two files outside tests and benchmarks (the default compressor,
ACP-SGD, in at most four: user-facing defaults)."""

from __future__ import annotations

from pathlib import Path

from planning import registry
from tests.support.structure import ROOT, files_naming, find_cycle, import_graph

#: Files where the string "none" means something other than the compressor: the launcher
#: mode (``GRADWIRE_LAUNCHER=none``), "no switches" in a summary, a Grafana unit.
NOT_THE_COMPRESSOR = {
    "none": {"coordinator/settings.py", "coordinator/schemas.py", "coordinator/launcher.py",
             "coordinator/launchers.py", "coordinator/api/health.py", "coordinator/train_cmd.py",
             "dashboards/generate.py"},
}


def test_the_checker_sees_imports_inside_functions(tmp_path: Path):
    package = tmp_path / "planning"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from planning import b\n")
    (package / "b.py").write_text("import planning.a\n")
    assert find_cycle(import_graph(tmp_path)) == ["planning.a", "planning.b", "planning.a"]


def test_no_import_cycle_among_the_project_modules():
    graph = import_graph()
    assert "compressors.base" in graph and "planning.registry" in graph
    assert find_cycle(graph) is None


def test_the_compressor_kernels_are_not_imported_by_the_registry_or_base():
    graph = import_graph()
    kernels = {registry.codec(name).kernel.partition(":")[0] for name in registry.names()}
    assert not graph["compressors.base"] & kernels
    assert not any(module.startswith(("compressors", "torch")) for module in graph["planning.registry"])


def test_each_compressor_name_is_written_in_at_most_two_files():
    found = files_naming(list(registry.BUILTIN_NAMES))
    for name, files in found.items():
        counted = set(files) - NOT_THE_COMPRESSOR.get(name, set())
        limit = 4 if name == registry.DEFAULT_COMPRESSOR else 2
        assert len(counted) <= limit, f"{name!r} is written in {sorted(counted)}"
        assert counted, f"{name!r} is written nowhere: the checker is broken"
    assert (ROOT / "planning" / "codecs" / "acpsgd.py").exists()
