"""The training runtime that runs inside each worker process (Ray Train or torch multiprocessing).

Kept import-light: ``workers.protocol`` must stay torch-free for the coordinator.
"""
