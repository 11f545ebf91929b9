"""A user's own code, outside gradwire: a small model, a dataset and a loss for gradwire jobs.

Nothing here imports gradwire. A JobSpec names the factories by import path
(``gw_example.models:make_model``, ``gw_example.data:spirals``, ``gw_example.losses:make_loss``)
and ships this package to the workers with ``runtime_env: {py_modules: [examples/userpkg/gw_example]}``.
"""
