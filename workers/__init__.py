"""The training runtime that runs inside each worker process (Ray Train or torch multiprocessing).

Kept import-light: ``planning.protocol`` must stay torch-free for the coordinator.
"""
