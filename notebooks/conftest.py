"""nbval over the committed notebooks (``make test``): the same session hooks as the unit tests (``tests/conftest.py``:
the project's offline data folder (``FEDLIB_DATA``), absent data skipped), so both find the data the same way."""

import importlib.util
from pathlib import Path

from nbval import kernel as nbval_kernel

_spec = importlib.util.spec_from_file_location("_tests_conftest", Path(__file__).parents[1] / "tests" / "conftest.py")
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)

pytest_configure = _conftest.pytest_configure
pytest_collection_modifyitems = _conftest.pytest_collection_modifyitems

# nbval's kernels on Unix sockets, as the notebook tests' (``tests/kernels.py``): two started side by side on two
# workers cannot meet on a TCP port
_kspec = importlib.util.spec_from_file_location("_tests_kernels", Path(__file__).parents[1] / "tests" / "kernels.py")
_kernels = importlib.util.module_from_spec(_kspec)
_kspec.loader.exec_module(_kernels)
nbval_kernel.KernelManager = _kernels.IPCKernelManager
