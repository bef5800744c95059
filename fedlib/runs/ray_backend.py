"""Grids on a Ray cluster: each unit of runs is one Ray task; the results come back to the driver, which stores them.

``run_configs(cfgs, backend="ray", address=...)`` (and ``python -m fedlib.experiments ... --backend ray``) hands the
configs not yet in the store to ``RayBackend.run``. Ray is imported only here, and only when this backend is used:
fedlib without Ray keeps its local process pool (``grids.run_configs(jobs=N)``), the default.

Units: runs that share data, model and method (``scheduling.batch_key``) train up to ``batch`` at a time as one model in
one task (``fedlib.runs.batching``: each run gets its solo run's numbers), as the local backend batches them; the grid
is cut with ``scheduling.batches``, within the memory Ray gives a task on the smallest node, into units of equal size,
cut further until every task slot has one (on a GPU, whose memory Ray does not report, the worker trains a unit too
large for its share of the free GPU memory in parts, one after another). ``batch=1`` sends one run per task. A unit's
runs come back together when its task ends; a run that fails inside a unit is reported alone, the unit's other runs are
stored.

What is sent where:

- driver -> task: the unit's configs as plain data (``RunConfig.to_dict()``, rebuilt and re-keyed on the worker: a
  node whose fedlib computes another key for one is refused, so mixed versions cannot store a run under the wrong
  key), the data root if the caller gave one (else the worker reads its own node's ``FEDLIB_DATA``, set where
  ``ray start`` ran), and where snapshots would go.
- task -> driver: each run's result as values -- per-round metrics (a DataFrame), per-client accuracy and loss
  arrays, client test sizes, traces, and meta (with ``ray_node``: the node that trained it). The driver writes them
  with ``Store.save`` (the atomic writer of the local backend: same keys, same files), so no shared filesystem is
  needed. A dataset missing on a worker fails that run with the usual ``DatasetNotFoundError`` naming the node.

Resources: each task declares ``num_cpus`` (threads it trains with, default 1) and ``num_gpus`` (a fraction, so that
several small units share a GPU; default 0.25 when the cluster has GPUs, else 0). A run without a GPU share trains on
the CPU even where the node has a GPU.

Faults: stored runs are skipped before anything is submitted. A task whose worker process or node dies is retried
by Ray (``max_retries``, default 2; its unit's runs continue from their snapshots), then reported by its configs'
labels; an exception raised by a run itself (bad data, a bug) is not retried. The other runs go on: the grid ends
with a ``RayGridError`` listing every failed config, with every finished run stored. Ctrl-C stores what has come
back (a whole unit, even if it came while storing the unit's first run), cancels the rest, and re-raises.

Snapshots (``Store.checkpoint``, every 5 minutes of a run) are taken only where the driver's store is reachable
from the worker at the same path (one machine, or a shared filesystem mounted alike everywhere): the driver leaves a
probe file in the store and a task snapshots only if it sees it. Elsewhere a retried or re-submitted run restarts
from round 1.
"""

from __future__ import annotations

import os
import pickle
import socket
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fedlib.runs import nofollow
from fedlib.runs.scheduling import DEFAULT_GPU_SHARE

RAY_VERSION = "2.60.0"  # the tested version (requirements.txt)
# a Ray node's raylet waits about 25 s for its agent processes to start, then crashes ("Timed out waiting for file
# .../dashboard_agent_listen_port_..."); on a small, loaded machine they can take longer. These let it wait
# 2 minutes (a local instance fedlib starts gets them; a `ray start` node takes them from its shell, see
# docs/cluster.md)
SLOW_START = {"RAY_raylet_start_wait_time_s": "120", "RAY_agent_register_timeout_ms": "120000"}


class RayGridError(RuntimeError):
    """Runs of a grid failed on Ray (after the retries a dead worker gets); ``failures``: (config, error) pairs.
    The grid's other runs were trained and stored."""

    def __init__(self, failures: list, stored: int):
        self.failures = failures
        lines = [f"{len(failures)} run(s) failed on Ray ({stored} stored); failed configs:"]
        lines += [f"  {cfg.label()}: {err}" for cfg, err in failures]
        super().__init__("\n".join(lines))


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            f"backend='ray' needs Ray: pip install -e '.[ray]' (or pip install ray=={RAY_VERSION}); "
            "the default backend='local' needs nothing more"
        ) from e
    return ray


def _probe(address: str, source: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the address, where nothing listens at ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``);
    ``ray.init`` would otherwise retry for a minute before giving up."""
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(
            f"{source}={address!r}: must be HOST:PORT of a Ray head (e.g. 10.0.0.1:6379, the port of "
            "`ray start --head --port=6379`), ray://HOST:PORT (Ray client), or 'auto' (a cluster started on this machine)"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConnectionError(
            f"{source}={address!r}: no Ray cluster answers at {host}:{port} ({e}). Start its head there with "
            f"`ray start --head --port={port}`, or leave the address out to start a Ray instance on this machine."
        ) from None


def connect(address: str | None = None) -> bool:
    """Connect this process to the Ray cluster at ``address`` (else ``RAY_ADDRESS``; neither: start a local
    instance). Already connected (``ray.init`` called before) and no ``address``: that connection is used. Returns
    whether this call connected (the caller then disconnects with ``ray.shutdown()``)."""
    ray = import_ray()
    if address is None and ray.is_initialized():
        return False
    source = "address" if address else "RAY_ADDRESS"
    addr = address or os.environ.get("RAY_ADDRESS") or None
    if addr and addr not in ("auto", "local"):
        _probe(addr, source)  # before anything else: a wrong address is named at once
    if ray.is_initialized():
        raise ValueError(
            f"address={address!r}: this process is already connected to a Ray cluster (ray.init was called); "
            "leave address out to use that one, or call ray.shutdown() first"
        )
    kw = {"logging_level": "WARNING"}
    if addr is None:  # a local instance: no dashboard (not needed, and slow to start)
        kw["include_dashboard"] = False
        for k, v in SLOW_START.items():
            os.environ.setdefault(k, v)
    try:
        ray.init(address=addr, **kw)
    except Exception as e:
        if addr is None:
            raise
        raise ConnectionError(f"{source}={addr!r}: could not connect to a Ray cluster there: {e}{auth_hint()}") from e
    return True


AUTH_MODE = "RAY_AUTH_MODE"


def auth_hint() -> str:
    """What to check when a driver reached a cluster's port (``_probe`` passed) and Ray still would not connect.

    A head started with token authentication refuses a driver without its token, and Ray says so only in its C++
    log ("Authentication token is missing or incorrect"), retried for a minute; what it raises is a plain "Failed to
    connect to Ray cluster", which named neither the token nor the variable. So the message names both: the
    driver's ``RAY_AUTH_MODE`` and where Ray looks for the token (docs/cluster.md, step 1)."""
    mode = os.environ.get(AUTH_MODE, "")
    said = repr(mode) if mode else "not set"
    where = "~/.ray/auth_token, or the file RAY_AUTH_TOKEN_PATH names, or RAY_AUTH_TOKEN itself"
    if mode.strip().lower() == "token":
        return (
            f". {AUTH_MODE}=token is set here: if the cluster uses token authentication, this driver's token "
            f"({where}) must be the head's (`ray get-auth-token` on the head prints it)"
        )
    return (
        f". If the cluster uses token authentication (a head started with {AUTH_MODE}=token refuses a driver "
        f"without its token), this driver lacks it: {AUTH_MODE} is {said} here; export {AUTH_MODE}=token and "
        f"give it the head's token ({where}; see docs/cluster.md)"
    )


def node_label() -> str:
    """This node as the messages name it: host name, IP and the start of Ray's node id (two nodes on one machine
    differ by the id)."""
    import ray

    ip = ray.util.get_node_ip_address()
    return f"{socket.gethostname()} ({ip}, node {ray.get_runtime_context().get_node_id()[:8]})"


def _train_task(spec: dict) -> list:
    """One unit of runs on a worker (the body of the Ray task): ``spec['configs']``, one run alone or several trained as
    one model (``fedlib.runs.train.train_unit``). Returns, per run in order, its result as values or the exception that
    ended it (a unit's other runs go on without it)."""
    import ray

    from fedlib.config.run import from_dict
    from fedlib.data.readers import DatasetNotFoundError
    from fedlib.runs import train as runner
    from fedlib.runs import worker
    from fedlib.runs.checkpoint import Checkpoint

    cfgs, node = [from_dict(c) for c in spec["configs"]], node_label()
    keys = [c.key() for c in cfgs]
    if spec.get("tracker") is not None:
        for key in keys:
            spec["tracker"].started.remote(key, node)
    for cfg, mine, theirs in zip(cfgs, keys, spec["keys"]):
        if mine != theirs:
            raise RuntimeError(
                f"on Ray node {node}: the fedlib installed there gives config {cfg.label()} the key {mine}, the "
                f"driver's gives {theirs}: install the driver's fedlib version on every node"
            )
    node_id = ray.get_runtime_context().get_node_id()
    worker.worker_setup(spec["runs_per_node"].get(node_id, 1), threads=spec["threads"])
    device = "cuda" if ray.get_gpu_ids() else "cpu"  # a run without a GPU share stays on the CPU, even on a GPU node
    shared = spec["probe"] and Path(spec["probe"]).exists()  # the driver's store is reachable here: snapshot
    checkpoints = {  # a snapshot is <store>/_partial/<key>.pt (``Store.checkpoint``): it stays inside that store
        k: Checkpoint(Path(p), spec["every"], root=Path(p).parents[1]) if shared else None
        for k, p in zip(keys, spec["snapshots"])
    }

    def located(e: BaseException) -> BaseException:
        if isinstance(e, DatasetNotFoundError):
            hint = f"{e.hint} (on Ray node {node}, whose workers read the FEDLIB_DATA that `ray start` had there)"
            return DatasetNotFoundError(e.dataset, e.root, e.expected, hint.strip())
        return e

    outcomes = {}
    try:
        for part in _fit(cfgs, device, spec.get("gpu_share", 0)):
            if len(part) == 1:
                try:
                    res = [runner.train(part[0], False, spec["data_root"], checkpoints[part[0].key()], device=device)]
                except DatasetNotFoundError:
                    raise
                except Exception as e:  # this run's failure, as a unit's (its other parts' results go back too)
                    res = [e]
            else:
                res = runner.train_unit(
                    part, spec["data_root"], lambda c: checkpoints[c.key()], lambda c, r: None, False, device
                )
            outcomes.update(zip((c.key() for c in part), res))
    except DatasetNotFoundError as e:
        raise located(e) from None
    out = []
    for res in (outcomes[k] for k in keys):
        if isinstance(res, BaseException):
            out.append(_portable(located(res)))
            continue
        res.meta["ray_node"] = node
        out.append({
            "metrics": res.metrics,
            "client_acc": res.client_acc,
            "client_loss": res.client_loss,
            "client_n": res.client_n,
            "traces": res.traces,
            "meta": res.meta,
        })  # fmt: skip
    return out


def _portable(e: BaseException) -> BaseException:
    """``e``, or a ``RuntimeError`` naming its type and message where ``e`` does not survive pickling (an exception
    whose ``__init__`` takes other arguments than its message): a run's failure returned as a value must reach the
    driver without taking its unit's other results down with it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def _fit(cfgs: list, device: str, gpu_share: float) -> list:
    """A unit as the parts a worker trains one after another: itself, except on a GPU, whose memory the driver could
    not see (Ray reports none): there, parts within ``BATCH_MEMORY_SHARE`` of the task's share of the GPU's free
    memory (``scheduling.batches``)."""
    from fedlib.executors import hardware
    from fedlib.runs.scheduling import BATCH_MEMORY_SHARE, batches

    free = hardware.available_bytes(device) if device == "cuda" else None
    if free is None or len(cfgs) == 1:
        return [cfgs]
    return batches(cfgs, len(cfgs), budget=free * min(1.0, gpu_share or 1.0) * BATCH_MEMORY_SHARE)


def _units(todo: list, batch: int, nodes: list, runs_per_node: dict, cost: dict | None = None) -> list:
    """``todo`` cut into the tasks' units (``scheduling.batches``): at most ``batch`` runs each, within the memory Ray
    gives one task on its smallest node, of equal size, none above its share of the cluster's task slots, cut
    further where that ends the grid sooner (in estimated seconds with ``cost``, else in rounds)."""
    from fedlib.runs.scheduling import BATCH_MEMORY_SHARE, batches

    per_task = [n["Resources"].get("memory", 0) / runs_per_node[n["NodeID"]] for n in nodes]
    budget = min(per_task) * BATCH_MEMORY_SHARE if per_task and min(per_task) > 0 else None
    return batches(todo, batch, jobs=sum(runs_per_node.values()), budget=budget, cost=cost)


class _TrackerActor:
    """Which runs have started, and on which node (a Ray actor the tasks tell at their start): the progress bar's
    'running' count and per-node placement."""

    def __init__(self):
        self.started_ = {}

    def started(self, key: str, node: str) -> None:
        self.started_[key] = node

    def snapshot(self) -> dict:
        return dict(self.started_)


@dataclass
class RayBackend:
    """Train configs as Ray tasks (see the module docstring). ``address``: a Ray head's ``HOST:PORT``,
    ``ray://HOST:PORT`` or ``'auto'`` (else ``RAY_ADDRESS``; neither: a local instance, stopped afterwards);
    ``num_cpus``: CPUs (and training threads) per task, a run or a unit of runs; ``num_gpus``: a GPU's share per task
    (None: 0.25 where the cluster has GPUs, else 0); ``max_retries``: re-runs of a task whose worker died;
    ``placement``: show in the progress bar how many runs each node is training."""

    address: str | None = None
    num_cpus: int = 1
    num_gpus: float | None = None
    max_retries: int = 2
    placement: bool = False

    def __post_init__(self):
        if not isinstance(self.num_cpus, int) or self.num_cpus < 1:
            raise ValueError(f"num_cpus={self.num_cpus!r} must be an integer >= 1 (CPUs, and threads, per run)")
        if self.num_gpus is not None and not (isinstance(self.num_gpus, (int, float)) and 0 <= self.num_gpus):
            raise ValueError(f"num_gpus={self.num_gpus!r} must be a number >= 0 (a GPU's share per run), or None")
        if self.num_gpus is not None and self.num_gpus > 1 and self.num_gpus != int(self.num_gpus):
            raise ValueError(f"num_gpus={self.num_gpus!r}: above 1 it must be a whole number of GPUs")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries={self.max_retries!r} must be an integer >= 0")

    def run(
        self, todo: list, store, progress: bool = True, data_root=None, batch: int = 1, cost: dict | None = None
    ) -> None:
        """Train ``todo`` (configs not in ``store``) on the cluster and store each result as it arrives. ``batch``:
        runs that share data, model and method train up to that many as one model in one task (``scheduling.batches``,
        each unit within the memory of its node's share). The tasks are submitted in ``todo``'s order (Ray starts
        them about in that order as slots free up: ``grids.run_configs`` puts the longest first); ``cost``: each
        run's estimated seconds by key (``estimates.seconds``), in which the units are balanced over the slots
        (else in rounds)."""
        if not todo:
            return
        ray = import_ray()
        mine = connect(self.address)
        probe = store.root / "_partial" / f"ray-probe-{uuid.uuid4().hex}"
        try:
            probe.parent.mkdir(parents=True, exist_ok=True)
            nofollow.create(probe).close()  # a new file: nothing planted there is opened
            self._run(ray, todo, store, progress, data_root, probe, batch, cost)
        finally:
            probe.unlink(missing_ok=True)
            try:
                probe.parent.rmdir()  # only if empty: no other run's snapshot there
            except OSError:
                pass
            if mine:
                ray.shutdown()

    def _run(self, ray, todo, store, progress, data_root, probe, batch, cost) -> None:
        from tqdm.auto import tqdm

        from fedlib.core.state import RunResult

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cpus = {n["NodeID"]: n["Resources"].get("CPU", 0) for n in nodes}
        runs_per_node = {k: max(1, int(c // self.num_cpus)) for k, c in cpus.items()}
        has_gpu = any(n["Resources"].get("GPU", 0) > 0 for n in nodes)
        gpu_share = self.num_gpus if self.num_gpus is not None else (DEFAULT_GPU_SHARE if has_gpu else 0)
        # tasks no node can hold would wait for ever: refuse them now, naming the parameter
        if self.num_cpus > max(cpus.values(), default=0):
            raise ValueError(
                f"num_cpus={self.num_cpus}: no node of the cluster has that many CPUs (largest: "
                f"{max(cpus.values(), default=0):g}); ask for fewer CPUs per run"
            )
        if not has_gpu and (gpu_share > 0 or any(c.device == "cuda" for c in todo)):
            what = f"num_gpus={gpu_share}" if gpu_share > 0 else "configs with device='cuda'"
            raise ValueError(f"{what}: the cluster has no GPU; use num_gpus=0 and device 'auto' or 'cpu'")
        tracker = ray.remote(num_cpus=0)(_TrackerActor).remote()
        task = ray.remote(_train_task)
        refs = {}
        for unit in _units(todo, batch, nodes, runs_per_node, cost):
            spec = {
                "configs": [c.to_dict() for c in unit],
                "keys": [c.key() for c in unit],
                "data_root": None if data_root is None else str(data_root),
                "runs_per_node": runs_per_node,
                "threads": self.num_cpus,
                "probe": str(probe),
                "snapshots": [str(store.checkpoint(c).path) for c in unit],
                "every": store.checkpoint(unit[0]).every_seconds,
                "tracker": tracker,
            }
            device = unit[0].device  # a unit's runs share their device (``scheduling.batch_key``)
            gpus = {"cpu": 0, "cuda": gpu_share or DEFAULT_GPU_SHARE}.get(device, gpu_share)  # 'auto': the share
            spec["gpu_share"] = gpus
            opts = dict(num_cpus=self.num_cpus, num_gpus=gpus, max_retries=self.max_retries, retry_exceptions=False)
            refs[task.options(**opts).remote(spec)] = unit
        pending, failures, done = list(refs), [], 0
        started, board = {}, tracker.snapshot.remote()
        # the bar moves by each unit's estimated seconds as it comes back (the runs, one each, without ``cost``): a
        # grid's few long runs would otherwise count as little as its many short ones
        work = {c.key(): 1.0 if cost is None else cost[c.key()] for c in todo}
        desc = f"ray: {len(nodes)} node(s), {sum(cpus.values()):g} CPUs"
        if cost is None:
            bar = tqdm(total=len(todo), desc=desc, disable=not progress, unit="run")
        else:  # estimated seconds from other versions and machines: only the share and the time left are shown
            form = "{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]"
            bar = tqdm(total=sum(work.values()), desc=desc, disable=not progress, bar_format=form)

        def collect(ready):
            """Store what the ``ready`` tasks brought back; a Ctrl-C while storing waits until all of it is stored."""
            nonlocal done
            stopped = None
            for ref in ready:
                unit = refs[ref]
                try:
                    outs = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # the task itself raised: its own error, not Ray's wrapper
                    cause = getattr(e, "cause", None) or e.as_instanceof_cause()
                    outs = [cause] * len(unit)
                except ray.exceptions.RayError as e:  # its worker or node died, max_retries times
                    outs = [f"{type(e).__name__} after {self.max_retries} retries: {e}"] * len(unit)
                for cfg, out in zip(unit, outs):
                    if not isinstance(out, dict):
                        failures.append((cfg, out))
                        continue
                    res = RunResult(
                        out["metrics"],
                        out["client_acc"],
                        out["client_loss"],
                        out["client_n"],
                        out["meta"],
                        cfg,
                        traces=out["traces"],
                    )
                    try:
                        store.save(cfg, res)
                        store.checkpoint(cfg).clear()
                        done += 1
                    except KeyboardInterrupt as e:  # the finished runs that came back are stored first
                        stopped = stopped or e
                bar.update(min(sum(work[c.key()] for c in unit), bar.total - bar.n))  # float sums stay in the total
            if stopped is not None:
                raise stopped

        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
                collect(ready)
                if ray.wait([board], timeout=0)[0]:
                    started, board = ray.get(board), tracker.snapshot.remote()
                going = [started[c.key()] for r in pending for c in refs[r] if c.key() in started]
                text = f"done {done}/{len(todo)}, running {len(going)}, failed {len(failures)}"
                if self.placement and going:
                    text += " | " + ", ".join(f"{n}: {k}" for n, k in sorted(Counter(going).items()))
                bar.set_postfix_str(text, refresh=True)
        except BaseException:
            # Ctrl-C (or a failure to store): keep what has finished, cancel the rest (their workers are stopped)
            try:
                collect(ray.wait(pending, num_returns=len(pending), timeout=0)[0])
            finally:
                for ref in pending:
                    ray.cancel(ref, force=True)
            raise
        finally:
            bar.close()
            ray.kill(tracker)
        if failures:
            raise RayGridError(failures, stored=done) from (
                failures[0][1] if isinstance(failures[0][1], BaseException) else None
            )
