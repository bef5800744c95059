"""The main job: execute every notebook headlessly with papermill, drawing the stored paper-profile results.

    python scripts/run_notebooks.py [--profile paper] [--stored-only] [--plan] [--only 00,10] [-p NAME=V1,V2 ...]
                                    [--jobs N] [--out build/notebooks]

By default every notebook runs at the paper profile, whose runs are in the committed store (``results/``): it draws
them and trains only what is missing. Before anything runs the job prints, per notebook, its experiments' runs stored
and to train (with an estimate from the seconds a round of runs of their kinds: ``fedlib.runs.estimates.known_times``),
and while a notebook runs it prints which cell is executing and how many of its runs are trained, with an ETA
(``--plan`` prints the plan and stops).
``--stored-only`` passes ``STORED_ONLY=True``: nothing trains. The notebooks train the runs they miss side by side,
one process per core (their ``JOBS = None``); ``--jobs N`` passes ``JOBS=N`` (``--jobs 1``: one at a time). With
more than one process, the runs the plan counts train first, all notebooks' as one grid (``train_first``), and the
notebooks then draw them (``--no-train-first``: each notebook trains its own).
``--profile quick`` (or smoke) explores; its results go to ``results/_explore/`` (git-ignored), not to the committed
store, unless ``FEDLIB_RESULTS`` says otherwise (``fedlib.runs.store.default_root``, as for a notebook opened by hand).
An explicit ``--profile`` (or ``-p PROFILE=...``) wins over the environment's ``FEDLIB_PROFILE`` (with a warning
naming both).

Executed copies go to ``build/notebooks/`` (a copy appears there only once its notebook has finished, failed or not);
the notebooks write figures to ``figures/``. ``-p NAME=V1,V2`` passes papermill parameters; comma lists expand to a
grid (one executed copy per combination), and the figures of such a run carry the parameters in their names
(``FEDLIB_FIGURE_TAG``), so they never overwrite the default run's; a name that no notebook run takes, or an
``--only`` that matches no notebook, is an error. A notebook lists in its metadata the data sets
it needs (``metadata.fedlib.requires``: when one is absent it is skipped) and the experiments it draws
(``metadata.fedlib.experiments``: what the plan counts; a data set absent from them makes the notebook "partial"),
and the data sets it draws when present (``metadata.fedlib.optional``: all absent and nothing to draw makes it
"nothing to run").
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = "paper"


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _grid(params: list[str]) -> list[dict]:
    keys, values = [], []
    for p in params:
        if "=" not in p:
            raise SystemExit(f"-p {p!r}: expected NAME=VALUE or NAME=V1,V2")
        k, v = p.split("=", 1)
        keys.append(k)
        values.append([_value(x) for x in v.split(",")] if not v.startswith(("[", "(", "{")) else [_value(v)])
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)] or [{}]


# the job's own parameters: every notebook takes them, or needs none (JOBS and BACKEND where nothing trains); they do
# not change what a notebook draws, so they stay out of its figures' names
JOB_PARAMS = ("PROFILE", "STORED_ONLY", "BACKEND", "JOBS")


def _check_parameters(names: set, notebooks: list[Path], pm) -> None:
    """Every ``-p`` name but ``JOB_PARAMS`` must be a parameter of at least one of ``notebooks`` (its ``parameters``
    cell; papermill injects any name, so a misspelt one, ``-p SEED=1`` for ``SEEDS``, would run the defaults
    silently)."""
    known = {p.name: set(pm.inspect_notebook(str(p))) for p in notebooks}
    stray = sorted(n for n in names if n not in JOB_PARAMS and not any(n in ps for ps in known.values()))
    if stray:
        have = sorted(set().union(*known.values())) if known else []
        raise SystemExit(
            f"-p {', '.join(stray)}: not a parameter of "
            + ("any of these notebooks (they take " if len(known) > 1 else "this notebook (it takes ")
            + f"{', '.join(have)})"
        )


TAG_CHARS = 80  # a tag's readable part at most; with the notebook's name and profile a file name stays far below 255


def tag(params: dict) -> str:
    """The name suffix of a parametrised run: ``DATA_SEED-1_X-a`` (empty for the default run); parameters that do
    not change the results (PROFILE goes into the name anyway, STORED_ONLY, BACKEND, JOBS) are left out.

    Values become safe file name parts (a "/" in a value made the executed copy's path point into a folder that does
    not exist). Where that loses something -- a character replaced (a non-ASCII letter, a space, a "/"), a value that
    reads back as another (the string "1" beside the number 1), or a name cut to ``TAG_CHARS`` (a 300-character value
    failed with "File name too long") -- the tag ends in ``_h`` and 12 hex digits of the SHA-256 of the parameters
    as given, so distinct parameters do not share a file name (they did: "é" and "ü" both became "X-_"). A tag kept
    whole contains no such suffix: there every "_"-separated part but a key's own holds a "-"."""

    def safe(v) -> str:
        return re.sub(r"[^A-Za-z0-9.=+-]+", "_", str(v)).strip("_") or "_"

    kept = {k: v for k, v in params.items() if k not in JOB_PARAMS}
    text = "_".join(f"{safe(k)}-{safe(v)}" for k, v in kept.items())
    whole = all(
        k.isidentifier() and safe(k) == k and safe(v) == str(v) and "_" not in str(v) and _value(str(v)) == v
        and type(_value(str(v))) is type(v)
        for k, v in kept.items()
    )  # fmt: skip
    if whole and len(text) <= TAG_CHARS:
        return text
    digest = hashlib.sha256(repr(sorted((str(k), repr(v)) for k, v in kept.items())).encode()).hexdigest()[:12]
    return f"{text[:TAG_CHARS].rstrip('_')}_h{digest}"


def choose_profile(explicit: str | None, env: str | None) -> tuple[str, str | None]:
    """(profile, warning): ``fedlib.config.run.resolve_profile`` (an explicit profile wins over FEDLIB_PROFILE, with a
    warning naming both), except that with neither given the job draws the committed store: 'paper'."""
    import warnings

    from fedlib.config.run import resolve_profile

    if not explicit and not env:
        return DEFAULT_PROFILE, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            profile = resolve_profile(explicit)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    return profile, "; ".join(str(w.message) for w in caught) or None


def failure(e: Exception, executed: Path) -> str:
    """One line for a notebook that failed: the cell and the error raised in it, and where the executed copy is (its
    traceback). A ``PapermillExecutionError``'s own text starts with an empty line, so "FAILED:
    PapermillExecutionError:" alone would say nothing."""
    ename, evalue = getattr(e, "ename", None), getattr(e, "evalue", None)
    if ename is None:  # not an error raised in a cell (papermill's own, a kernel that died, ...)
        return f"{type(e).__name__}: {next(iter(str(e).strip().splitlines()), '')}"
    first = next(iter(str(evalue).strip().splitlines()), "")
    return f"cell [{getattr(e, 'exec_count', '?')}] raised {ename}: {first} (traceback in {executed})"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "unknown"
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


class Plan:
    """What a notebook draws: its experiments' configs, which are stored, the data sets absent, an estimate."""

    def __init__(self, nb: Path, profile: str, meta: dict):
        self.nb, self.profile = nb, profile
        self.requires = meta.get("requires", [])
        self.experiments = meta.get("experiments", [])
        self.optional = meta.get("optional", [])  # data sets drawn when present (e.g. Office-31's domains)
        self.configs, self.absent, self.lines = [], [], []

    def scan(self, store) -> "Plan":
        import fedlib

        seen = set()
        for entry in self.experiments:
            name, where = (entry, None) if isinstance(entry, str) else (entry["name"], entry.get("where"))
            ex = fedlib.experiment(name, self.profile, stored_only=True, progress=False, where=where, store=store)
            new = [c for c in ex.configs if c.key() not in seen and not seen.add(c.key())]
            self.configs += new
            self.absent += [a for a in ex.absent if a not in self.absent]
            todo = sum(not store.has(c) for c in new)
            self.lines.append(f"{name}: {len(ex.configs)} configs, {len(ex.configs) - todo} stored, {todo} to train")
        if not self.configs and not self.absent:
            self.absent = [d for d in self.optional if not _present(d)]
        self.store = store
        self.todo = [c for c in self.configs if not store.has(c)]
        return self

    def estimate(self, known: dict) -> float | None:
        """Seconds to train ``todo``, one after another, from the runs of the same kind (``estimates.seconds_for``:
        their median seconds a round, times the rounds; ``known``: ``estimates.known_times``, the stored runs' and this
        version's reference timings); None: a kind with no time known."""
        from fedlib.runs import estimates

        total = 0.0
        for c in self.todo:
            s = estimates.seconds_for(c, known)
            if s is None:
                return None
            total += s
        return total

    def status_note(self) -> str:
        """'partial: mnist absent', 'nothing to run: office31 absent' or ''."""
        if not self.absent:
            return ""
        return f"{'partial' if self.configs else 'nothing to run'}: {', '.join(self.absent)} absent"


def _present(dataset: str) -> bool:
    """A data set of ``readers`` with both splits, or a domain data set with at least one domain, is present."""
    from fedlib.data import domains, readers

    if dataset in readers.DATASETS:
        return readers.available(dataset)
    return bool(domains.available().get(dataset))


def _job_params(grid: list[dict], args) -> list[dict]:
    """The job's own ``-p`` values checked before any kernel starts (else a bad one fails every notebook, each in a
    cell): ``STORED_ONLY`` one of True / False, and then the job's ``--stored-only`` (the plan, the skips and the
    progress follow it, not the notebooks alone); ``BACKEND`` and ``JOBS`` as ``fedlib.experiment`` checks them
    (``fedlib.runs.scheduling.check_jobs``, ``fedlib.runs.grids.ray_backend``)."""
    from fedlib.runs.grids import ray_backend
    from fedlib.runs.scheduling import check_jobs

    stored = {p["STORED_ONLY"] for p in grid if "STORED_ONLY" in p}
    if stored:
        if len(stored) > 1 or not all(isinstance(v, bool) for v in stored):
            raise SystemExit(f"-p STORED_ONLY takes one value, True or False (got {', '.join(map(repr, stored))})")
        (value,) = stored
        if args.stored_only and not value:
            raise SystemExit("--stored-only and -p STORED_ONLY=False disagree: give one")
        args.stored_only = value
        grid = [{k: v for k, v in p.items() if k != "STORED_ONLY"} for p in grid]
    for p in grid:
        given = ", ".join(f"-p {k}={p[k]}" for k in ("BACKEND", "JOBS") if k in p)
        try:
            check_jobs(p.get("JOBS"))
            ray_backend(p.get("BACKEND", "local"), None, p.get("JOBS"))
        except ValueError as e:
            raise SystemExit(f"{given}: {e}") from None
    return grid


def plan_exact(grid: list[dict]) -> bool:
    """Whether the plan's configs are the ones the notebooks draw: no parameter but the job's own (``SEEDS``,
    ``DATA_SEED`` and the like change the configs; the plan reads them from the experiments' profiles alone)."""
    return len(grid) == 1 and set(grid[0]) <= set(JOB_PARAMS)


def pretrainable(grid: list[dict]) -> bool:
    """Whether the plan's runs are the ones the notebooks will train: ``plan_exact``, and no ``BACKEND`` (it leaves
    training to the notebooks; ``STORED_ONLY`` is the job's own ``--stored-only`` by then, ``_job_params``)."""
    return plan_exact(grid) and "BACKEND" not in grid[0]


def train_first(todo: list, jobs: int, store) -> None:
    """Train the runs every notebook misses as one grid on ``jobs`` processes, before the first notebook starts.

    Each notebook trains its own missing runs side by side, but a notebook of a few uneven runs keeps one process
    busy while the others idle (AdaFL Tables 3-4, the selection dynamics: their processes gain far less than twofold
    over one at a time). One grid of all the notebooks' runs keeps every process busy until its last unit
    (``fedlib.runs.grids.run_configs`` starts the longest,
    by the stored runs of their kind, so that short ones fill the end). A later stage's runs (FedMCSA
    Table 1's winners, which its grid's results decide) are not in the plan: their notebook trains them. With one
    process this gains nothing and is skipped. A run that fails here is left to its notebook, which reports it. The
    whole job gains little from it on two processes, within a machine's run-to-run noise (``--no-train-first`` to
    compare; measured: docs/measurements/)."""
    if jobs < 2:
        return
    from fedlib.runs.grids import run_configs

    print(f"TRAIN {len(todo)} runs of every notebook first, as one grid on {jobs} processes", flush=True)
    t0 = time.time()
    try:
        run_configs(todo, store=store, jobs=jobs, progress=True)
    except Exception as e:  # report and go on: each notebook trains (and reports) what is still missing
        print(f"     training first stopped: {type(e).__name__}: {e}; the notebooks train what is missing", flush=True)
    else:
        print(f"     {sum(store.has(c) for c in todo)}/{len(todo)} runs stored ({time.time() - t0:.0f} s)", flush=True)


class Progress(threading.Thread):
    """Prints, every ``every`` seconds while a notebook runs, the cell executing (read from papermill's output
    notebook, which it saves at every cell start) and the runs of the plan now stored, with an ETA."""

    def __init__(self, name: str, partial: Path, plan: Plan | None, every: float = 20.0):
        super().__init__(daemon=True)
        self.name, self.partial, self.plan, self.every = name, partial, plan, every
        self.stop = threading.Event()
        self.t0 = time.time()

    def line(self) -> str | None:
        parts = []
        try:
            cells = json.loads(self.partial.read_text())["cells"]
            code = [c for c in cells if c["cell_type"] == "code"]
            done = sum(c["metadata"].get("papermill", {}).get("status") == "completed" for c in code)
            parts.append(f"cell {min(done + 1, len(code))}/{len(code)}")
        except (OSError, ValueError, KeyError):
            pass
        if self.plan is not None and self.plan.todo:
            n = len(self.plan.todo)
            trained = sum(self.plan.store.has(c) for c in self.plan.todo)
            elapsed = time.time() - self.t0
            eta = elapsed / trained * (n - trained) if trained else None
            parts.append(f"runs trained {trained}/{n}, ETA {fmt_seconds(eta) if trained else 'after the first run'}")
        if not parts:
            return None
        return f"     ... {self.name}: {', '.join(parts)} ({time.time() - self.t0:.0f} s)"

    def run(self):
        last = None
        while not self.stop.wait(self.every):
            line = self.line()
            if line and line.split(" (")[0] != last:
                print(line, flush=True)
                last = line.split(" (")[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--profile", default=None, help="smoke | quick | paper (default: FEDLIB_PROFILE, else paper: the store)"
    )
    ap.add_argument("--stored-only", action="store_true", help="pass STORED_ONLY=True: draw the store, train nothing")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated notebook number prefixes, e.g. 00,10 (or 1 for every FedMCSA notebook)",
    )
    ap.add_argument("-p", "--param", action="append", default=[], help="papermill parameter NAME=VALUE[,VALUE...]")
    ap.add_argument("--out", default=str(ROOT / "build" / "notebooks"))
    ap.add_argument("--dir", default=str(ROOT / "notebooks"), help="folder of the numbered notebooks")
    ap.add_argument(
        "--jobs",
        default=None,
        help="runs trained side by side, one process each: passes JOBS (default: the notebooks' own, one per core)",
    )
    ap.add_argument("--plan", action="store_true", help="print the plan (runs stored / to train, estimates) and stop")
    ap.add_argument("--every", type=float, default=20.0, help="seconds between progress lines (default 20)")
    ap.add_argument(
        "--no-train-first",
        action="store_true",
        help="let each notebook train its own missing runs (default: with more than one process, the runs every "
        "notebook misses train first, as one grid)",
    )
    args = ap.parse_args(argv)
    # 0 would make the progress thread re-read the running notebook without pause, nan would pass "<= 0" (every
    # comparison with it is false) and inf never print: a finite number of seconds, more than 0 (nan fails this)
    if not 0 < args.every < float("inf"):
        ap.error(f"--every={args.every:g}: seconds between progress lines, more than 0 (a finite number)")
    if not Path(args.dir).is_dir():  # else it would run nothing and exit 0
        ap.error(f"--dir {args.dir}: no such folder")
    if Path(args.out).exists() and not Path(args.out).is_dir():  # else a FileExistsError traceback
        ap.error(f"--out {args.out}: not a folder")

    import papermill as pm

    from fedlib.data import readers
    from fedlib.runs import estimates, malloc
    from fedlib.runs.estimates import known_times
    from fedlib.runs.scheduling import default_jobs, jobs_arg, span_seconds
    from fedlib.runs.store import Store, default_root

    try:
        malloc.mode()  # a bad FEDLIB_MALLOC: one line here, not a traceback in every notebook that trains
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if args.jobs is not None:
        try:
            args.param.append(f"JOBS={jobs_arg(args.jobs)}")
        except ValueError as e:
            raise SystemExit(str(e)) from None
    grid = _grid(args.param)
    explicit = args.profile
    profiles_in_grid = {p["PROFILE"] for p in grid if "PROFILE" in p}
    if len(profiles_in_grid) > 1:
        raise SystemExit("-p PROFILE takes one value (run the job once per profile)")
    if profiles_in_grid:
        (p_value,) = profiles_in_grid
        if explicit and explicit != p_value:
            raise SystemExit(f"--profile={explicit!r} and -p PROFILE={p_value!r} disagree: give one")
        explicit = p_value
    grid = _job_params(grid, args)
    profile, warning = choose_profile(explicit, os.environ.get("FEDLIB_PROFILE"))
    if warning:
        print(f"WARNING: {warning}")
    env = {"FEDLIB_PROFILE": profile}  # the kernel resolves the same profile as this job
    if not os.environ.get("OMP_NUM_THREADS"):
        # one thread per kernel: these models' operations are small, and torch's threads spin on a busy CPU: on a
        # loaded machine, small runs with torch's default threads take many times as long as with one, one after
        # another or batched as one model (``benchmarks.bench.time_grid``; measured: docs/measurements/).
        # OMP_NUM_THREADS set by the caller wins.
        env["OMP_NUM_THREADS"] = "1"
    if profile != "paper":  # every run of the job in the exploring store, a cell's ``fedlib.run(cfg)`` included
        env["FEDLIB_RESULTS"] = str(default_root(profile))  # FEDLIB_RESULTS if set, else results/_explore/
    saved_env = {k: os.environ.get(k) for k in [*env, "FEDLIB_FIGURE_TAG"]}
    os.environ.update(env)
    try:
        store = Store.of(None, profile)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        only = [s for s in args.only.split(",") if s]
        every = sorted(Path(args.dir).glob("[0-9]*.ipynb"))
        if not every:
            raise SystemExit(f"no numbered notebooks (00_name.ipynb, ...) in {args.dir}")
        notebooks = [p for p in every if not only or p.name.startswith(tuple(only))]
        unmatched = [s for s in only if not any(p.name.startswith(s) for p in every)]
        if unmatched:  # else it would run nothing and exit 0
            raise SystemExit(
                f"--only {','.join(unmatched)} matches no notebook in {args.dir} "
                f"(they start {', '.join(sorted({p.name[:2] for p in every}))})"
            )
        _check_parameters({k for p in grid for k in p}, notebooks, pm)  # JOBS, which --jobs adds, is a job's own
        print(
            f"profile={profile}{' (stored only: nothing trains)' if args.stored_only else ''}, "
            f"data root={readers.data_root()}, store={store.root}, {len(notebooks)} notebook(s) -> {out}"
        )
        # the plan, before anything runs
        known = known_times(store)  # this store's runs' times, else the committed ones': any profile's
        plans, skipped = {}, {}
        for nb in notebooks:
            meta = json.loads(nb.read_text()).get("metadata", {}).get("fedlib", {})
            missing = readers.missing(meta.get("requires", []))
            if missing:
                skipped[nb.name] = f"skipped: data absent ({', '.join(missing)}; see data/README.md)"
                continue
            plans[nb.name] = plan = Plan(nb, profile, meta).scan(store)
            if args.stored_only and plan.configs and len(plan.todo) == len(plan.configs) and plan_exact(grid):
                # nothing to draw: each table and figure would fail on an empty frame (``NothingStoredError``)
                n, note = len(plan.configs), plan.status_note()
                skipped[nb.name] = (
                    f"skipped: nothing stored at profile {profile} ({n} run{'s' * (n > 1)}; without --stored-only "
                    f"they train){'; ' + note if note else ''}"
                )
        # runs shared by several notebooks (31, 33 and 35 draw one grid) count once
        drawn = {c.key(): c for p in plans.values() for c in p.configs}
        todo = [c for k, c in drawn.items() if not store.has(c)]
        total = len(todo)
        print(f"plan: {len(drawn)} runs drawn, {total} to train", end="")
        # every notebook's runs train first as one grid (``train_first``), else each notebook trains its own
        one_grid = bool(todo) and not args.stored_only and not args.no_train_first and pretrainable(grid)
        est = [estimates.seconds_for(c, known) for c in todo]
        if total:
            known_est = sum(e for e in est if e is not None)
            given = [p["JOBS"] for p in grid if isinstance(p.get("JOBS"), int)]  # else the notebooks' own: None
            jobs = max(given) if given else default_jobs(todo)
            side = f"; {jobs} processes side by side" if jobs > 1 else ""
            if jobs > 1 and not args.stored_only:  # as the job will train them
                parts, seen = ([todo] if one_grid else []), set()
                for p in () if one_grid else plans.values():  # runs shared by notebooks train in the first one
                    parts.append([c for c in p.todo if c.key() not in seen])
                    seen.update(c.key() for c in p.todo)
                side += f", about {fmt_seconds(sum(span_seconds(part, jobs, known) for part in parts if part))}"
            print(
                f" (about {fmt_seconds(known_est)} of training from the times of runs of their kinds, one after another"
                + (", plus runs of kinds not stored yet" if None in est else "")
                + side
                + ("; nothing trains: --stored-only" if args.stored_only else "")
                + ")",
                end="",
            )
        print()
        varied = sorted({k for p in grid for k in p} - set(JOB_PARAMS))
        if varied:  # the plan reads the experiments' profiles alone: its counts are the defaults'
            print(
                f"  (the plan is for the notebooks' default parameters: -p {', '.join(varied)} runs each notebook "
                f"{len(grid)} time(s), and each may draw and train other runs)"
            )
        for nb in notebooks:
            if nb.name in skipped:
                print(f"  {nb.name:40} {skipped[nb.name]}")
                continue
            p = plans[nb.name]
            note = p.status_note()
            head = f"{len(p.configs)} runs, {len(p.todo)} to train" if p.experiments else "no training"
            if p.todo:
                head += f" (~{fmt_seconds(p.estimate(known))})"
            print(f"  {nb.name:40} {head}{'; ' + note if note else ''}")

        if args.plan:
            return 0
        if one_grid:
            train_first(todo, jobs, store)
            for p in plans.values():  # what each notebook still trains (a later stage's runs, a failed run)
                p.todo = [c for c in p.todo if not store.has(c)]
        status = {}
        for nb in notebooks:
            if nb.name in skipped:
                status[nb.name] = skipped[nb.name]
                print(f"SKIP {nb.name}: {skipped[nb.name].removeprefix('skipped: ')}", flush=True)
                continue
            plan = plans[nb.name]
            for params in grid:
                params = {k: v for k, v in params.items() if k != "PROFILE"}
                suffix = tag(params)
                label = nb.name + (f" [{suffix}]" if suffix else "")
                target = out / f"{nb.stem}{'_' + suffix if suffix else ''}.{profile}.ipynb"
                partial = target.with_name(f".{target.stem}.running.ipynb")
                if suffix:
                    os.environ["FEDLIB_FIGURE_TAG"] = suffix
                else:
                    os.environ.pop("FEDLIB_FIGURE_TAG", None)
                if plan.todo and not args.stored_only and not varied:
                    print(f"RUN  {label}: trains {len(plan.todo)} run(s) first: " + "; ".join(plan.lines), flush=True)
                else:
                    print(f"RUN  {label}", flush=True)
                t0 = time.time()
                watch = Progress(label, partial, plan if not (args.stored_only or varied) else None, args.every)
                watch.start()
                try:
                    pm.execute_notebook(
                        str(nb),
                        str(partial),
                        parameters={"PROFILE": profile, "STORED_ONLY": args.stored_only, **params},
                        cwd=str(nb.parent),
                        kernel_name="python3",
                        progress_bar=False,
                        # the kernel's own log would say "running over TCP without encryption" at every start and
                        # "KeyboardInterrupt caught in kernel" when jupyter_client interrupts it to shut it down;
                        # errors in cells and a dying kernel still come back as papermill's exceptions
                        extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
                    )
                    note = plan.status_note()
                    status[label] = f"{note or 'ok'} ({time.time() - t0:.0f} s)"
                except KeyboardInterrupt:
                    partial.unlink(missing_ok=True)  # no half-executed notebook left in build/
                    raise
                except Exception as e:  # report and go on: one failing notebook must not hide the others
                    status[label] = "FAILED: " + failure(e, target)
                finally:
                    watch.stop.set()
                if partial.exists():
                    partial.replace(target)
                print(f"     {status[label]}", flush=True)
        print("\nsummary:")
        for k, v in status.items():
            print(f"  {k:45} {v}")
        return 1 if any(v.startswith("FAILED") for v in status.values()) else 0
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    sys.exit(main())
