"""The gradwire service: REST jobs, embedded store, Ray launcher, adaptive decisions, metrics.

The web process never imports torch; Ray and the worker loop are imported lazily by the launcher.
"""
