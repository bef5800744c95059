"""Faults for the Ray tests, injected from the test suite: a task function that kills its worker process once.

``crash_once(key, marker)`` is a Ray task body: the unit that trains config ``key`` dies (``os._exit``) right after
that run's first snapshot where the store is reachable (else at its start), once: ``marker`` is left as the proof and
keeps the retry alive. The function travels to the workers by value (``register``), so the workers need not import
the test suite."""

import os
from pathlib import Path


def crash_once(key: str, marker: Path):
    def task(spec: dict) -> list:
        from fedlib.runs import checkpoint, ray_backend

        if key in spec["keys"] and not Path(marker).exists():
            Path(marker).touch()
            if not (spec["probe"] and Path(spec["probe"]).exists()):
                os._exit(1)
            save = checkpoint.Checkpoint.save

            def save_then_die(self, snap):
                save(self, snap)
                if self.key == key:
                    os._exit(1)  # dies mid-run, its snapshot on disk

            checkpoint.Checkpoint.save = save_then_die
        return ray_backend._train_task(spec)

    return task


def register() -> None:
    """Ship this module's functions to Ray's workers by value."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
