"""``python -m benchmarks``: the benchmark's command line (``benchmarks.bench``)."""

import sys

from benchmarks.bench import main

sys.exit(main())
