"""Scale simulator: the α-β pipelined-bucket model of ``planning.costmodel``, at paper scale.

Why: this machine can run 2 (at most 4) workers on emulated links of a few hundred Mbit/s,
while the paper's claims are about 8-64 GPUs on 1/10/100 Gb/s. The cost model the adaptive
policy already uses (``planning.costmodel.predict_step``: buckets ready in reverse layer
order, one compute stream, one link, PowerSGD's two dependent rounds) is fed here with

* **measured per-bucket backward compute**: ``benchmarks.paper`` records, in a calibration
  run, when each parameter's gradient becomes ready during backward; those ready times are
  summed into whatever bucket layout a method uses (the paper-scale predictions keep the
  measured *shape* of backward and scale it to an assumed GPU total, see below);
* **measured encode/decode time**: each real run's own ``compress + decompress`` CPU seconds
  for the validation (× :func:`codec_share_factor` where ranks outnumber cores; PyTorch's
  hook, whose codec cannot be timed in its run, by ``benchmarks.paper``'s estimate: our PowerSGD's ×
  the torch/ours ratio measured apart in the runs' layouts), and
  ``benchmarks/results/compressor_cost.json`` (same parameter shapes as the paper: ResNet-50
  rank 4, BERT-Base rank 32) turned into seconds per element pass for the paper-scale
  predictions, so the N-dependent decode of the all-gather methods scales;
* **measured links**: α and β fitted in every real run (``workers.probe.probe_link``).

It does two things:

1. ``validate``: re-predict every real small-scale run of ``paper.json`` (same shapes, layout,
   pipelining, link) and report the prediction error (target: within 20 %);
2. ``scale``: predict iteration time of every method for 8-64 workers at 1, 10 and 100 Gb/s on
   ResNet-50 (batch 64, rank 4) and BERT-Base (batch 32, seq 64, rank 32), and ACP-SGD's
   speedups at 32 workers on 1 and 10 GbE beside the paper's averages (4.06×, 1.43×).

ASSUMED (not measured here, no GPU on this machine): V100-class fp32 compute times, GPU
encode/decode = CPU time ÷ ``GPU_CODEC_SPEEDUP`` (+ a launch overhead per bucket phase), and
per-message latencies α of the three networks; all in :data:`GPU_COMPUTE`, :data:`NETWORKS`.

    python -m benchmarks.simulate --paper-json benchmarks/results/paper.json \
        --json-out benchmarks/results/simulate.json

Modules: :mod:`.model` (methods as specs, layouts, ``predict``), :mod:`.scale` (paper-scale
inputs and grid), :mod:`.validate` (re-predicting the real runs), :mod:`.report` (outputs);
the names below are the package's public interface.
"""

from benchmarks.simulate.model import (
    CASTS,
    METHODS,
    TOPK_RATIO,
    Compute,
    bucket_segments,
    layout_for,
    method_spec,
    predict,
)
from benchmarks.simulate.scale import (
    COST_NAMES,
    GPU_CODEC_FIXED_S,
    GPU_CODEC_SPEEDUP,
    GPU_COMPUTE,
    NETWORKS,
    gpu_codec,
    network_link,
    ready_fractions,
    scale_grid,
    speedups,
)
from benchmarks.simulate.validate import codec_share_factor, links_by_setting, validate, validation_summary

__all__ = [
    "CASTS", "COST_NAMES", "GPU_CODEC_FIXED_S", "GPU_CODEC_SPEEDUP", "GPU_COMPUTE", "METHODS", "NETWORKS", "TOPK_RATIO", "Compute", "bucket_segments",
    "codec_share_factor", "gpu_codec", "layout_for", "links_by_setting", "method_spec", "network_link", "predict",
    "ready_fractions", "scale_grid", "speedups", "validate", "validation_summary",
]
