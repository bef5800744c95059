"""Files of the results store opened without following symbolic links.

A store may be shared or unpacked from someone else's archive, so a name in it can be a link planted to point
anywhere. Followed, a link lets the store's own writes land outside it: a snapshot's ``_partial/<key>.json`` linked
to a user's file had the file overwritten by the snapshot's progress line, and the link deleted afterwards, when the
run finished. So every file the store reads or writes in ``_partial/`` and in run folders goes through here:

- ``read_regular``: opened with ``O_NOFOLLOW`` (a link is refused, not followed) and ``O_NONBLOCK`` (a fifo is not
  waited on), then checked on the open descriptor to be a regular file, so that no swap between a check and the
  open can slip a link, a device or a fifo in.
- ``create``: a new file, ``O_CREAT | O_EXCL | O_NOFOLLOW``: it never opens what is already there, link or not.
- ``replace_with``: a file's content written to a new sibling and renamed over it; ``os.replace`` replaces a link
  itself, never the file it points to.
- ``link_on_the_way``: the first link between a store's root and a path in it (the ``_partial`` folder made a link to
  another disk would take the snapshots there): a store keeps its files inside itself.

Links above the store's root (a home folder on another disk, ``results`` itself linked) are the user's own layout and
are followed as usual.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path
from typing import BinaryIO

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows, which has no symlinks an unprivileged user can make
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)


class NotARegularFile(ValueError):
    """A store's file that is a link, a fifo, a device or a folder: never read or written through."""


def is_link(path: Path) -> bool:
    return os.path.islink(path)


def _why_not(path: Path) -> str:
    if is_link(path):
        return f"{path.name} is not a regular file (a symbolic link to {os.readlink(path)})"
    return f"{path.name} is not a regular file"


def regular(path: Path) -> bool:
    """Whether ``path`` itself (a link is not followed) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_regular(path: Path, most: int | None = None, size: int | None = None) -> bytes:
    """The bytes of the regular file ``path``. ``NotARegularFile`` for a link (not followed), a fifo or a device;
    ValueError for a size other than ``size`` or above ``most`` (checked before the file is read whole); OSError as
    the system raises it (a file that is not there)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _BINARY)
    except OSError as e:
        if is_link(path):  # ELOOP (Linux, macOS) or EMLINK (FreeBSD): O_NOFOLLOW refused a link
            raise NotARegularFile(_why_not(path)) from None
        raise e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(_why_not(path))
        if size is not None and st.st_size != size:
            raise ValueError(
                f"{path.name} has {st.st_size} bytes, its manifest says {size}: changed after it was stored"
            )
        if most is not None and st.st_size > most:
            raise ValueError(f"{path.name} has {st.st_size} bytes, more than a {path.name} holds ({most})")
        return f.read()


def create(path: Path) -> BinaryIO:
    """A new file at ``path``, open for writing; FileExistsError if anything (a file, a link) is already there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, 0o666)
    return os.fdopen(fd, "wb")


def replace_with(path: Path, data: bytes) -> None:
    """Give ``path`` the content ``data`` atomically: written to a new sibling (``create``), then renamed over
    ``path``, so a link there is replaced by the file and the file it pointed to is left as it was."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with create(tmp) as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def link_on_the_way(root: Path, path: Path) -> Path | None:
    """The first of ``path``'s folders below ``root`` (``path`` itself excluded) that is a symbolic link; None if
    none is (or ``path`` is not under ``root``)."""
    root, path = Path(root), Path(path)
    try:
        parts = path.parent.relative_to(root).parts
    except ValueError:
        return None
    here = root
    for part in parts:
        here = here / part
        if is_link(here):
            return here
    return None
