"""Torch-free planning: what the coordinator and the workers agree on, without torch or Ray.

One description per compressor (``codecs/``, the ``Codec`` base in ``codec``) and the one
registry of them (``registry``), specs and byte formulas (``spec``, ``wire``), the cost model that
predicts a step's time (``costmodel``), the adaptive policy and its objective (``policy``,
``progress``), the controller that turns reports into versioned decisions (``controller``)
and the wire protocol between workers and coordinator (``protocol``).

Nothing here imports torch, Ray or the ``compressors``/``workers``/``coordinator`` packages
(``tests/unit/test_imports.py`` checks it), so the coordinator's image can install it alone.
See docs/architecture.md.
"""
