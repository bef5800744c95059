"""What a run is: ``run.RunConfig`` (the run config and its key), ``parts`` (its typed parts), ``legacy`` (the flat,
dotted and schema-1 names mapped onto the parts) and ``options`` (the bounded options every method, part and stage
declares).

The library reads a config through its typed parts (``cfg.local.lr``, ``cfg.model.name``, ``cfg.method.mu``);
the flat names (``lr``, ``model``, ``mu``) are for users and stored ``config.json`` files, and only ``legacy`` knows
them (see ``fedlib.config.run``).

``options`` imports nothing of fedlib: the algorithms register their options classes with it. ``parts`` and ``run``
sit above the registries a config is validated against (methods, models, data sets), so this package's ``__init__``
imports none of them; import ``fedlib.RunConfig`` or ``fedlib.config.run``.
"""
