"""The networks gradwire trains and benchmarks, one family per module, in plain ``torch.nn``.

Pick one by name through :func:`workers.models.build_model` (the registry); these modules
define the layers only. The large networks reproduce the parameter *shapes* of the reference
implementations (torchvision's ResNets and VGG-16, Google's BERT), because a compressor is
judged on the shapes of the gradients it sends. This package's ``__init__`` imports nothing, so
importing one family does not import the others.
"""
