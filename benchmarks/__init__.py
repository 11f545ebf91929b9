"""gradwire's benchmarks: paper reproduction, adaptive evaluation, cost-model calibration, scale
simulator, network testbed, emulated cluster, codec cost, accuracy, coordinator load, GPU check.

Run each from the repository root as ``python -m benchmarks.NAME`` (``--help`` lists its
options); README.md's "Benchmarks" section gives the command behind every figure. Shared by
all of them: :mod:`benchmarks.machine` (the machine-wide benchmark lock, waiting for a quiet
machine, the foreign load a run records) and :mod:`benchmarks.testbed` (hosts in network
namespaces joined by shaped links). Nothing outside ``benchmarks`` and ``tests`` imports this
package.
"""
