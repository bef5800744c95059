"""``python -m fedlib.experiments``: the command line (``fedlib.experiments.cli``)."""

import sys

from fedlib.experiments.cli import main

sys.exit(main())
