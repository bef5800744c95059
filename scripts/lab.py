"""``make lab``: JupyterLab on working copies of the notebooks, so that exploring never rewrites the committed ones.

The committed notebooks hold the outputs nbval compares against; JupyterLab saves what it has open (autosave every
two minutes), so it opens copies in ``build/lab/`` (git-ignored) instead: made once, kept across sessions with your
edits, made again from the committed ones with ``--fresh`` (``make lab FRESH=1``). The notebooks find the data, the
store and the figures folder from the package, so the copies run as the originals do. The lab's own settings start
each notebook's kernel (the project's, named in the notebook) without asking.

    python scripts/lab.py [--port 8888] [--fresh] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "build" / "lab"


def prepare(lab: Path | None = None, fresh: bool = False, notebooks: Path | None = None) -> list[Path]:
    """Copy ``notebooks/*.ipynb`` into ``lab`` (default ``LAB``; the ones not there yet, every one with ``fresh``) and
    write the lab's settings; returns the copies made."""
    lab, notebooks = LAB if lab is None else lab, ROOT / "notebooks" if notebooks is None else notebooks
    lab.mkdir(parents=True, exist_ok=True)
    made = []
    for nb in sorted(notebooks.glob("*.ipynb")):
        copy = lab / nb.name
        if fresh or not copy.exists():
            shutil.copyfile(nb, copy)
            made.append(copy)
    tracker = lab / ".settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text(json.dumps({"autoStartDefaultKernel": True}) + "\n")
    return made


def command(lab: Path | None = None, port: int | None = None) -> list[str]:
    """The JupyterLab command on ``lab`` (default ``LAB``): its files, its settings and workspaces there too."""
    lab = LAB if lab is None else lab
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={lab}",
           f"--LabApp.user_settings_dir={lab / '.settings'}", f"--LabApp.workspaces_dir={lab / '.workspaces'}"]  # fmt: skip
    if port is not None:
        cmd.append(f"--ServerApp.port={port}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # a container's root: JupyterLab refuses it unless told
        cmd.append("--allow-root")
    return cmd


def port_arg(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"--port={text}: a TCP port, 1 to 65535")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/lab.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=port_arg, default=None, help="the port JupyterLab listens on (default: its own)")
    ap.add_argument("--fresh", action="store_true", help="copy every committed notebook again over its working copy")
    ap.add_argument("--dry-run", action="store_true", help="prepare the copies and print the command, start nothing")
    args = ap.parse_args(argv)
    made = prepare(fresh=args.fresh)
    print(
        f"working copies in {LAB.relative_to(ROOT)}/ ({len(made)} copied now); the committed notebooks stay as they are"
    )
    cmd = command(port=args.port)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # see scripts/run_notebooks.py
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
