"""What a run is: ``run.RunConfig`` (the typed parts and the run's key), and ``options`` (the bounded options every
method, part and stage declares).

``options`` imports nothing of fedlib: the algorithms register their options classes with it. ``run`` sits above the
registries it validates a config against (methods, models, data sets), so this package's ``__init__`` imports
neither; import ``fedlib.RunConfig`` or ``fedlib.config.run``.
"""
