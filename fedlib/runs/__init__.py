"""Runs of configs: train one (``train``), grids (``grids``), runs trained together as one model (``batching``),
scheduling over processes (``scheduling``, ``pool``) or a Ray cluster (``ray_backend``), snapshots and Ctrl-C
(``checkpoint``), the results store (``store``), memory checks (``feasibility``) and time estimates
(``estimates``)."""
