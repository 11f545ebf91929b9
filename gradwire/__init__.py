"""gradwire in a training script you already have: three lines.

* Ray Train (``TorchTrainer``): ``model = gradwire.ray.prepare(model, compression="acpsgd")``
  instead of ``ray.train.torch.prepare_model(model)``, and ``gradwire.ray.step(loss)`` after
  ``optimizer.step()``.
* torchrun (no Ray): ``model = gradwire.torch.prepare(model, ...)`` instead of ``DDP(model)``,
  and ``gradwire.torch.step(loss)``.

``coordinator="http://host:8321"`` (or ``GRADWIRE_URL``) reports the run to a gradwire
coordinator as an external job — per-phase telemetry, Prometheus metrics, the live page, the
adaptive policy's decisions and operator pins; without one, an adaptive policy runs in the
script itself. The work is done by :mod:`workers.session`; this package only adapts it to
the two launchers (dependencies point one way: compressors <- workers <- gradwire).
"""

from gradwire._current import close, current, step

__all__ = ["close", "current", "step"]
