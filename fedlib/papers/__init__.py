"""One package per paper (``fedmcsa``, ``adafl``, ``pfedla``): its grids, published numbers, tables and figures.

Each package keeps its experiment grids (``grids``: pure functions of the profile and the data present), the tables
it reads from the store (``tables``) and its matplotlib figures (``figures``) in separate modules, and re-exports
their public names, so ``from fedlib.papers import fedmcsa; fedmcsa.X`` works whichever module holds ``X``. Nothing
here trains or runs an experiment: the runners (``fedlib.runs``, ``fedlib.experiments``) sit above and call the
grids, so the papers' code can be read, tested and used to redraw every committed figure from the committed store
without training anything. ``paper_data`` holds the published numbers; ``report`` the paper-vs-ours tables the
papers share.
"""
