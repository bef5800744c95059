"""One entry point for the named experiments (``fedlib.experiments.profiles.EXPERIMENTS``), used by every notebook and the CLI.

    ex = fedlib.experiment("fedmcsa_table2", "paper", stored_only=True)   # in a notebook: read what is stored
    ex.configs, ex.absent, ex.missing_runs, ex.table, ex.frame

    python -m fedlib.experiments fedmcsa_table2 --profile paper [--where seed=0] [--jobs 2] [--dry-run]
    python -m fedlib.experiments adafl_table1 adafl_fig3 adafl_table3 --profile paper --where seed=0 --jobs 2
    python -m fedlib.experiments fedmcsa_table1 --profile paper   # the grid, then the winners step, then the winners
    python -m fedlib.experiments status --profile paper      # every experiment: stored / to run
    python -m fedlib.experiments fedmcsa_sigma --profile quick --backend ray --address HEAD:6379   # on a Ray cluster

``--where FIELD=VALUE`` (repeatable; FIELD flat, ``mu``, or dotted, ``method.mu``) keeps the configs that match, e.g.
one seed of every cell before the others. Stored runs are skipped and a run that was stopped continues from its last
snapshot (taken every 5 minutes), so the command resumes an interrupted grid. Runs are stored under
``FEDLIB_RESULTS``, else in results/ at the paper profile and in the git-ignored results/_explore/ at the others.
``--jobs N`` trains N configs at a time, one single-threaded process each (on a CPU: N = the cores; ``--jobs auto``:
one per core, as many as the memory holds, ``fedlib.runs.scheduling.default_jobs``).
``--batch N`` (default 16): configs that share data, model and method (seeds, lr, sigma, ... differ) train up to N
at a time as one model (``fedlib.runs.batching``), each with its solo run's numbers; ``--batch 1`` trains one at a time.
``--backend ray`` trains each unit of runs (``--batch``) as a task on a Ray cluster: the one at ``--address
HOST:PORT`` (else ``RAY_ADDRESS``; neither: a Ray instance started on this machine); this process stores the results
(docs/cluster.md; ``fedlib.runs.ray_backend``).
Several experiments run as one queue, in the order named, a config shared by two of them once. An experiment with
a step (FedMCSA Table 1's winners) queues the experiment the step reads first, trains the queue so far, runs the
step on the stored results, then queues its own configs.
"""

from __future__ import annotations

import argparse
import ast

from fedlib.config.run import PROFILES, flat_field_names, flat_name, resolve_profile
from fedlib.data.readers import DatasetChecksumError, DatasetFormatError, DatasetNotFoundError
from fedlib.executors.graphs import graphs_from_env
from fedlib.experiments import profiles
from fedlib.experiments.named import Experiment, _matches, _table, experiment, status
from fedlib.runs import scheduling
from fedlib.runs.feasibility import TooLarge
from fedlib.runs.malloc import mode as malloc_mode
from fedlib.runs.scheduling import BATCH
from fedlib.runs.store import Store, StoreNotWritable, checkpoint_seconds
from fedlib.runs.threads import check as check_threads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fedlib.experiments", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "experiment",
        nargs="+",
        choices=["status"] + sorted(profiles.EXPERIMENTS),
        help="one or more experiments (one queue), or 'status': one line per experiment, stored / to run, runs nothing",
    )
    ap.add_argument(
        "--profile",
        default=None,
        choices=PROFILES,
        help="smoke | quick | paper (beats FEDLIB_PROFILE; default: FEDLIB_PROFILE or quick)",
    )
    ap.add_argument("--where", action="append", default=[], help="FIELD=VALUE filter, e.g. seed=0 or method.mu=0.1")
    ap.add_argument(
        "--jobs",
        default="1",
        help="configs trained at a time, one process each (default 1; auto: one per core, within the memory)",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=BATCH,
        help=f"runs sharing data, model and method trained together as one model, at most (default {BATCH}; 1: one "
        "at a time); each gets its solo run's numbers",
    )
    ap.add_argument("--dry-run", action="store_true", help="list the configs and what is stored, run nothing")
    ap.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: this machine, --jobs processes (default); ray: each unit of runs (--batch) a task on a Ray "
        "cluster",
    )
    ap.add_argument(
        "--address",
        default=None,
        help="with --backend ray: the Ray head, HOST:PORT (default: RAY_ADDRESS, else a Ray instance on this machine)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads this process computes with (default: OMP_NUM_THREADS if set, else the cores other processes "
        "leave free, rechecked while training); --jobs workers compute with one each",
    )
    ap.add_argument("--cpus-per-run", type=int, default=None, help="with --backend ray: CPUs (threads) per task (1)")
    ap.add_argument(
        "--gpus-per-run",
        type=float,
        default=None,
        help="with --backend ray: a GPU's share per task (default 0.25 where the cluster has GPUs, else 0)",
    )
    ap.add_argument(
        "--placement", action="store_true", help="with --backend ray: show how many runs each node is training"
    )
    args = ap.parse_args(argv)
    try:
        args.jobs = scheduling.jobs_arg(args.jobs)
        check_threads(args.threads)
        malloc_mode()  # a bad FEDLIB_MALLOC: here, not as a traceback from every worker
        graphs_from_env()  # a bad FEDLIB_CUDA_GRAPHS likewise
        checkpoint_seconds()  # and FEDLIB_CHECKPOINT_SECONDS (a traceback from the grid)
        resolve_profile(args.profile)  # a bad FEDLIB_PROFILE (--profile's choices are checked above): a usage error
    except ValueError as e:
        ap.error(str(e))
    if args.batch < 1:
        ap.error(f"--batch={args.batch} must be an integer >= 1 (1: one run at a time)")
    backend = "local"
    ray_only = {"--address": args.address, "--cpus-per-run": args.cpus_per_run, "--gpus-per-run": args.gpus_per_run}
    if args.backend == "local":
        given = [k for k, v in {**ray_only, "--placement": args.placement or None}.items() if v is not None]
        if given:
            ap.error(f"{', '.join(given)}: only with --backend ray")
    else:
        if args.jobs != 1:
            ap.error("--jobs is for --backend local; on Ray the cluster's CPUs (and --cpus-per-run) decide")
        from fedlib.runs.ray_backend import RayBackend

        try:
            backend = RayBackend(
                address=args.address,
                num_cpus=1 if args.cpus_per_run is None else args.cpus_per_run,
                num_gpus=args.gpus_per_run,
                placement=args.placement,
            )
        except ValueError as e:
            ap.error(str(e).replace("num_cpus=", "--cpus-per-run=").replace("num_gpus=", "--gpus-per-run="))
    try:
        where = parse_where(args.where)
    except ValueError as e:
        ap.error(str(e))
    return _main(ap, args, where, backend)


def parse_where(items: list[str]) -> dict:
    """``--where FIELD=VALUE`` arguments as ``{flat field: value}``, the value a Python literal where it reads as one
    (``seed=0``: 0), else the string; a ValueError naming the argument and the fields allowed otherwise."""
    where = {}
    for w in items:
        k, sep, v = w.partition("=")
        try:
            k = flat_name(k) if sep else None
        except ValueError:
            k = None
        if k is None:
            raise ValueError(
                f"--where={w!r} must be FIELD=VALUE with FIELD a config field, flat or dotted (method.mu): "
                f"{', '.join(sorted(flat_field_names()))}"
            )
        try:
            where[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            where[k] = v
    return where


DATA_ERRORS = (DatasetNotFoundError, DatasetChecksumError, DatasetFormatError)


def absent_for_empty(name: str, profile: str, inputs: dict) -> list[str]:
    """The data sets absent under the data root that experiment ``name`` would run on, for one whose grid is empty:
    an experiment that has cells only for the data sets present (pFedLA's Office grids, its digits grids below two
    domains) reports no absent data set (``Experiment.absent``), so its grid is built again as if every data set were
    present and checked against what is (``profiles.available_cells``)."""
    from fedlib.data import readers
    from fedlib.data.domains import DOMAINS

    every = profiles.Available(frozenset({"synthetic", *readers.DATASETS, *DOMAINS}), tuple(DOMAINS.items()))
    base, grid = profiles.get(name, profile, every, **inputs)
    return profiles.available_cells(profiles.flat_cells(grid), base, profiles.Available.scan())[1]


def _main(ap, args, where, backend) -> int:
    def planned(name, **kw) -> Experiment:
        """The experiment's configs, nothing trained; bad input (a --where that matches nothing) is a usage error."""
        try:
            return experiment(name, args.profile, stored_only=True, progress=False, store=store, **kw)
        except ValueError as e:
            ap.error(str(e))

    if "status" in args.experiment:
        if len(args.experiment) > 1:
            ap.error("'status' takes no experiment names: it lists every experiment")
        profile = resolve_profile(args.profile)
        store = Store.of(None, profile)
        print(f"profile {profile}, results in {store.root}")  # the exploring profiles' store is not the committed one
        print(status(profile, where, store).to_string(index=False))
        return 0
    names = []
    for name in args.experiment:  # an experiment with a step: the experiment the step reads goes first
        prior = profiles.STEPS.get(name, (None,))[0]
        if prior is not None and prior not in names:
            names.append(prior)
        if name not in names:
            names.append(name)
    store, queue, seen, missing = Store.of(None, resolve_profile(args.profile)), [], set(), []

    def flush(final: bool = False):
        """Train (or, dry, list) the queue so far; the last call reports even an empty queue (nothing matched)."""
        if not queue and not (final and not seen):
            return
        print(f"{len(queue)} configs, {sum(store.has(c) for c in queue)} stored, results in {store.root}")
        if args.dry_run:
            for c in queue:
                print(("stored  " if store.has(c) else "to run  ") + c.label())
        else:
            cols = ("dataset", "model", "algorithm", "sigma", "seed")
            try:
                table = _table(queue, store, cols, jobs=args.jobs, backend=backend, batch=args.batch,
                               threads=args.threads)  # fmt: skip
            except (ConnectionError, ImportError, StoreNotWritable, TooLarge, *DATA_ERRORS) as e:
                # a wrong --address / RAY_ADDRESS, Ray not installed; runs too large (alone or side by side); a store that is a file or read-only (refused
                # before anything trains); a data file absent, damaged or malformed (the message names it; the runs
                # finished before it are stored)
                raise SystemExit(f"python -m fedlib.experiments: error: {e}") from None
            if table.empty:  # no configs at all (a grid empty for another reason than absent data): nothing to show
                print("nothing to run: no configs")
            else:
                print(table.drop(columns=["key"]).to_string())
        queue.clear()

    for name in names:
        inputs = {}
        if name in profiles.STEPS:
            prior, keyword, step = profiles.STEPS[name]
            flush()  # the step reads the stored results of the experiment before it: train those first
            before = planned(prior)
            inputs[keyword] = step(before.configs, store)
            print(
                f"step {step.__name__}: {len(inputs[keyword])} {keyword} from {len(before.runs)} of "
                f"{len(before.configs)} {prior} runs stored"
            )
        if name in args.experiment:
            ex = planned(name, where=where, inputs=inputs)
            configs = ex.configs
        else:  # only queued for a step: --where picks its configs too, but may match none (the grid's seed 0 when
            # the winners' seeds 1-2 are asked for) without being a usage error
            ex = planned(name, inputs=inputs)
            configs = [c for c in ex.configs if _matches(c, where)]
        queue += [c for c in configs if c.key() not in seen and not seen.add(c.key())]
        absent = ex.absent if ex.configs or ex.absent else absent_for_empty(name, ex.profile, inputs)
        missing += [m for m in absent if m not in missing]
        if missing and name == names[-1]:
            print(f"data absent, skipped: {', '.join(missing)} (see data/README.md)")
    if missing and not seen:  # else it would print "0 configs" and then fail on an empty table (a KeyError traceback)
        from fedlib.data.readers import data_root

        raise SystemExit(
            f"python -m fedlib.experiments: error: nothing to train or show: every config needs data absent under "
            f"{data_root()} ({', '.join(missing)}); put it there or set FEDLIB_DATA (see data/README.md)"
        )
    flush(final=True)
    return 0
