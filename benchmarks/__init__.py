"""fedlib's benchmark, outside the package: it imports fedlib, fedlib never imports it (``python -m benchmarks``)."""
