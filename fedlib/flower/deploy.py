"""A deployment: fedlib's Flower apps run by Flower's own processes (a SuperLink, one SuperNode per client, ``flwr
run``) over the network, the run stored like a simulated one.

``write_app(folder, cfg, store)`` writes a Flower app project (``pyproject.toml`` and a module naming ``server`` and
``client`` below); ``flwr run`` ships it to the SuperLink, whose ServerApp reads the run's config from the app's run
config (``config``: the run config's JSON, ``store``: where the result goes, ``snapshot``: the file its server
snapshots itself to after every round and resumes from, or empty) and whose SuperNodes each run a
ClientApp on their own partition (``--node-config "partition-id=i"``: client i of ``load_federated(cfg)``). When the
last round is evaluated the server stores the run under its config's key, with ``deployment: flower`` in its
metadata, so a notebook reads it beside the simulated run of the same config (kept in another store: the same key).

``local(cfg, store)`` starts all of it on this machine over localhost (``python -m fedlib.flower local``).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedlib.config.run import RunConfig, from_dict
from fedlib.flower import apps

server = ServerApp()
client = ClientApp()
_clients: dict[str, ClientApp] = {}


def _config(context: Context) -> RunConfig:
    return from_dict(json.loads(str(context.run_config["config"])))


@server.main()
def _serve(grid: Grid, context: Context) -> None:
    from fedlib.runs.store import Store

    cfg = _config(context)
    store = Store(str(context.run_config["store"]))
    t0 = time.perf_counter()

    def done(srv) -> None:
        import flwr
        import numpy
        import torch

        import fedlib

        meta = {"deployment": "flower", "flwr": flwr.__version__, "fedlib": fedlib.__version__,
                "torch": torch.__version__, "numpy": numpy.__version__, "python": platform.python_version(),
                "device": "cpu", "executor": cfg.executor, "wall_seconds": round(time.perf_counter() - t0, 3),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
        path = store.save(cfg, srv.result(meta), replace=True)
        print(f"fedlib.flower: stored {path}", flush=True)

    timeout = float(context.run_config.get("round-timeout", 0)) or None  # type: ignore[arg-type]
    snapshot = str(context.run_config.get("snapshot", "")) or None
    apps.server_app(cfg, done, round_timeout=timeout, wait_nodes=120.0, held=_held(cfg), snapshot=snapshot)(
        grid, context
    )


def _held(cfg: RunConfig):
    """The data the server evaluates itself (a global test set, held-out new clients: ``evaluation.Held``), read
    from the server's own data root as the clients read theirs; a server without a copy evaluates neither, and says
    so (those columns stay empty, never filled with another model's numbers)."""
    from fedlib.data import load_federated
    from fedlib.data.readers.common import DatasetNotFoundError

    try:
        return load_federated(cfg)
    except DatasetNotFoundError as e:
        print(f"fedlib.flower: the server has no copy of the data ({e}): no global test set or new clients "
              "evaluated at the server", flush=True)  # fmt: skip
        return None


def _client_for(context: Context) -> ClientApp:
    key = str(context.run_config["config"])
    if key not in _clients:
        _clients[key] = apps.client_app(_config(context))
    return _clients[key]


@client.query()
def _query(msg: Message, context: Context) -> Message:
    return _client_for(context)(msg, context)


@client.train()
def _train(msg: Message, context: Context) -> Message:
    return _client_for(context)(msg, context)


@client.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    return _client_for(context)(msg, context)


APP_MODULE = "fedlib_flower_app"


def write_app(folder: Path | str, cfg: RunConfig, store: Path | str, round_timeout: float = 0.0,
              snapshot: Path | str | None = None) -> Path:  # fmt: skip
    """A Flower app project in ``folder`` running ``cfg`` (``flwr run folder``), its result stored in ``store``;
    ``snapshot``: the file its server snapshots itself to after every round and resumes from when the app runs
    again (``fedlib.flower.checkpoint.Snapshots``; None: none)."""
    cfg.validate()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    conf = json.dumps(json.dumps(cfg.to_dict(), sort_keys=True))  # a TOML basic string holding the JSON
    (folder / "pyproject.toml").write_text(f'''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedlib-flower-app"
version = "1.0.0"
description = "fedlib's {cfg.method.NAME} as Flower apps (generated by python -m fedlib.flower app)"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedlib"

[tool.flwr.app.components]
serverapp = "{APP_MODULE}:server"
clientapp = "{APP_MODULE}:client"

[tool.flwr.app.config]
config = {conf}
store = {json.dumps(str(Path(store).resolve()))}
round-timeout = {float(round_timeout)}
snapshot = {json.dumps(str(Path(snapshot).resolve()) if snapshot is not None else "")}
''')
    (folder / f"{APP_MODULE}.py").write_text(
        '"""fedlib\'s Flower apps (generated by python -m fedlib.flower app)."""\n\n'
        "from fedlib.flower import deploy\n\n"
        "server = deploy.server  # assigned, not imported: flwr finds the names by reading the module\n"
        "client = deploy.client\n"
    )
    return folder


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def local(cfg: RunConfig, store: Path | str, *, port: int = 8000, log_dir: Path | str | None = None,
          kill: tuple[int, int] | None = None, round_timeout: float = 0.0, timeout: float = 900.0,
          snapshot: Path | str | None = None) -> Path:  # fmt: skip
    """``cfg`` deployed on this machine: a SuperLink on ``127.0.0.1:port`` (its Fleet, Control and Runtime APIs),
    one SuperNode per client, ``flwr run`` of a generated app; returns the stored run's folder. The processes log
    to ``log_dir`` (default: a temporary folder) and are stopped at the end. ``kill=(client, round)``: kill that
    client's SuperNode once it has received its first message of that round (the fault test). The SuperLink marks
    a node that stops its heartbeats unavailable (after two missed heartbeats, a minute) and answers its messages
    with an error: the round goes on without it, recorded. ``round_timeout`` (seconds; 0: none): how long a round
    waits for its replies before it goes on without the missing ones. ``snapshot``: as ``write_app``'s."""
    from fedlib.runs.store import Store

    work = Path(tempfile.mkdtemp(prefix="fedlib-flower-"))
    logs = Path(log_dir) if log_dir is not None else work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    home = work / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{port}"\n'
                                      "insecure = true\n")  # fmt: skip
    app = write_app(work / "app", cfg, store, round_timeout=round_timeout, snapshot=snapshot)
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # flwr's own commands
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": path,
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        out = open(logs / f"{name}.log", "wb")  # noqa: SIM115  (closed with the process)
        p = subprocess.Popen([_bin(args[0]), *args[1:]], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work)
        procs.append(p)
        return p

    try:
        start("superlink", "flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
              "--port", str(port))  # fmt: skip
        time.sleep(3)
        nodes = [start(f"client{i}", "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
                       "--port", str(port + 100 + i), "--node-config", f"partition-id={i} num-partitions={cfg.data.n_clients}")
                 for i in range(cfg.data.n_clients)]  # fmt: skip
        runner = start("flwr-run", "flwr", "run", str(app), "local", "--stream")
        t0, killed = time.monotonic(), False
        folder = Store(store).path(cfg)
        while time.monotonic() - t0 < timeout:
            if (
                kill
                and not killed
                and f"ROUND {kill[1]}]" in (logs / f"client{kill[0]}.log").read_text(errors="replace")
            ):
                nodes[kill[0]].kill()  # SIGKILL: the node vanishes mid-round, as a crashed machine does
                killed = True
            if (folder / "manifest.json").exists() and Store(store).load(cfg) is not None:
                return folder
            if runner.poll() is not None and not (folder / "manifest.json").exists():
                time.sleep(2)  # the log stream may end before the server has written
                if not (folder / "manifest.json").exists():
                    raise RuntimeError(f"fedlib.flower: the run ended without storing a result; see {logs}")
            time.sleep(1)
        raise TimeoutError(f"fedlib.flower: no stored result within {timeout} s; see {logs}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        if log_dir is None:
            shutil.rmtree(work, ignore_errors=True)
