"""The paper's evaluation (ICDCS'23 ACP-SGD), reproduced at small scale on the emulated network.

Methods: ``ssgd`` (DDP all-reduce, compressor ``none``), ``signsgd``, ``topk`` (ratio 0.01),
``powersgd`` (ours), ``torch_powersgd`` (PyTorch's ``powerSGD_hook``) and ``acpsgd``, on
ResNet-50, ResNet-152, BERT-Base and a BERT-Large-like model, 2 (and 4) workers, each worker
in its own network namespace of ``benchmarks.testbed`` with a ``tc`` rate limit.

Why a benchmark-side rank runner (``_rank``) instead of ``workers.rank_main``: every method,
PyTorch's hook included, must be timed by the same code; the paper's statistics need every
iteration's time (5 blocks of 10 after 10 warm-up), which the job summary (window means) does
not keep; and the BERT-Large-like model needs a layer-count override that ``TrainConfig`` has
no field for. The runner reuses the worker's parts -- ``workers.models``, ``workers.data``,
``compressors.GradientSync`` with its ``pipelining`` switch, ``workers.timing.StepTimer``,
``workers.probe.probe_link`` -- and is only the timed data/forward/backward/optimizer steps.

Scaling (this machine: 2 shared CPU cores, no GPU; the parameter *shapes* -- what the
compressors see and what goes over the link -- are the paper's, except BERT-Large's depth):

=============  ===========================  ==================  =====  ================
workload       model here                   paper               rank   bytes S-SGD/step
=============  ===========================  ==================  =====  ================
ResNet-50      batch 8, 32 px, 1000 classes batch 64, 224 px    4      102 MB
ResNet-152     batch 4, 32 px, 1000 classes batch 32, 224 px    4      241 MB
BERT-Base      batch 4, seq 32              batch 32, seq 64    32     438 MB
BERT-Large     8 of 24 layers, batch 2,     batch 8, seq 64     32     ~530 MB
               seq 32 (hidden 1024, 16 heads, FFN 4096: BERT-Large's layer shapes)
=============  ===========================  ==================  =====  ================

PyTorch's ``powerSGD_hook`` on gloo: it ``.wait()``s on its second all-reduce inside the
completion callback of the first, which runs on a gloo worker thread; with several buckets in
flight that thread blocks while the collective it waits for is queued behind another bucket's,
and the job deadlocks. So ``torch_powersgd`` runs with ONE bucket (``bucket_cap_mb`` 10000):
its whole PowerSGD runs after backward, unpipelined -- that is how it can run on gloo at all.
Our ``powersgd`` (same algorithm and bytes, pipelined over 25 MB buckets) is the fair
PowerSGD baseline; both are reported.

Regimes: from a calibration run per model (S-SGD with pipelining off on a fast link, so
backward compute is clean) and the byte formulas, the script computes (a) the rate where
S-SGD's communication is ~4× its compute and (b) the rate where PowerSGD's communication
equals backward compute, and runs there; acceptance (a)-(c) is evaluated on those cells.

    python -m benchmarks.paper --quick  # ResNet-50 (6 methods) + BERT-Base (S-SGD, ACP-SGD at (a);
                                         # the PowerSGD family at (b)), 5 + 2×2 iterations, < 10 min
    python -m benchmarks.paper          # + the 100/500/2000 Mbit/s grid for all four models,
                                         # ResNet-50 on 4 workers, ablations (a few hours)

Finished configurations are cached (``--cache-dir``), so an interrupted run resumes, and
re-running the same command re-renders the reports without measuring again.

Every measured configuration holds ``/tmp/gradwire-bench.lock`` (flock) so it never runs
at the same time as another engineer's benchmark. Needs root for the network namespaces.

Modules: :mod:`.cells` (workloads, protocols, cells), :mod:`.rank` (one rank; the isolated
codec measurement), :mod:`.runner` (measuring cells, with the cache), :mod:`.stats` (the
statistics and the plan's predictions), :mod:`.acceptance` (the three claims), :mod:`.report`
(tables, plots), :mod:`.cli` (the command); the names below are the package's public interface.
"""

from benchmarks.paper.acceptance import acceptance
from benchmarks.paper.cells import METHODS, WORKLOADS, Cell, Protocol, Workload
from benchmarks.paper.stats import add_codec_estimates, summarize

__all__ = ["METHODS", "WORKLOADS", "Cell", "Protocol", "Workload", "acceptance", "add_codec_estimates", "summarize"]
