"""python -m fedlib.flower: fedlib's methods as Flower apps.

    python -m fedlib.flower app DIR [name=value ...] [--store S] [--snapshot F]   write a Flower app project
                                                                                  running the config
    python -m fedlib.flower local [name=value ...] [--store S] [--snapshot F]     a SuperLink and one SuperNode per
                                                                                  client on localhost, flwr run of
                                                                                  the app, the run stored

The config is ``RunConfig`` flat names (``algorithm=fedmcsa n_clients=3 rounds=3 model=mlr``); the run is stored
in ``--store`` (default: the default store's ``_deployed`` folder, ``Store.deployed()``, so it sits beside the
simulated run of the same config, which has the same key) with ``deployment: flower`` in its metadata. With
``--snapshot F`` the server seals its state to F after every round and, started again, resumes from F (the clients
keep their own state: docs/flower.md, "Checkpoints"). With ``app``, run it yourself:

    flower-superlink --insecure --disable-runtime-dependency-installation
    flower-supernode --insecure --superlink 127.0.0.1:8000 --port 8100 --node-config "partition-id=0"   # one per client
    flwr run DIR <connection>      # a SuperLink connection in $FLWR_HOME/config.toml: address = "127.0.0.1:8000"
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def config(items: list[str]):
    from fedlib.config.run import RunConfig

    fields = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"python -m fedlib.flower: {item!r} is not name=value (a RunConfig field)")
        fields[name] = _value(value)
    cfg = RunConfig(**fields)
    cfg.validate()
    return cfg


def default_store() -> Path:
    from fedlib.runs.store import Store

    return Store.of(None).deployed().root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedlib.flower", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("app", help="write a Flower app project")
    a.add_argument("folder")
    lo = sub.add_parser("local", help="deploy on localhost and store the run")
    lo.add_argument("--port", type=int, default=8000, help="the SuperLink's port (SuperNodes: port + 100 + i)")
    lo.add_argument("--logs", default=None, help="keep the processes' logs in this folder")
    for p in (a, lo):
        p.add_argument("fields", nargs="*", help="RunConfig fields, name=value")
        p.add_argument("--store", default=None, help="where the run is stored (default: <store>/_deployed)")
        p.add_argument(
            "--snapshot",
            default=None,
            help="a file the server snapshots itself to after every round "
            "and resumes from when started again (default: none)",
        )
    args = ap.parse_args(argv)
    from fedlib.flower import deploy

    cfg = config(args.fields)
    store = Path(args.store) if args.store else default_store()
    if args.command == "app":
        print(deploy.write_app(args.folder, cfg, store, snapshot=args.snapshot))
    else:
        print(deploy.local(cfg, store, port=args.port, log_dir=args.logs, snapshot=args.snapshot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
