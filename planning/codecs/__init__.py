"""One torch-free description per compressor (a ``planning.codec.Codec`` subclass each).

Its torch kernel lives in ``compressors/`` under the import path the description names;
``planning/registry.py`` lists them. Nothing is imported here.
"""
