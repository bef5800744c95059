"""Jupyter kernels for the tests on Unix sockets instead of TCP ports.

A kernel started the usual way gets five TCP ports picked as free a moment before it binds them; two kernels started
side by side on two test workers once lost a reply and hung the test command. ``IPCKernelManager`` gives each kernel
socket files in a folder of its own (``transport='ipc'``), so kernels started at the same time cannot meet, and the
notebook tests run on both workers. Only the tests use it: a notebook run from the command line or JupyterLab keeps
Jupyter's defaults."""

from __future__ import annotations

import os
import tempfile

from jupyter_client.manager import KernelManager


class IPCKernelManager(KernelManager):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.transport = "ipc"
        self.ip = os.path.join(tempfile.mkdtemp(prefix="fedlib-kernel-"), "kernel")
