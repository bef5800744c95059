"""One entry point for the named experiments (``fedlib.experiments.profiles.EXPERIMENTS``), used by every notebook
and the command line (``fedlib.experiments.cli``)::

    ex = fedlib.experiment("fedmcsa_table2", "paper", stored_only=True)   # in a notebook: read what is stored
    ex.configs, ex.absent, ex.missing_runs, ex.table, ex.frame

An experiment's configs come from its grid at the profile, over the data sets present; stored runs are read, the
others trained (``stored_only``: none), a stopped run continuing from its snapshot. An experiment with a step
(FedMCSA Table 1's winners) runs the experiment the step reads first, then the step on its stored results.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import pandas as pd

from fedlib.config.run import RunConfig, flat_name, resolve_profile
from fedlib.experiments import profiles
from fedlib.runs import estimates, grids
from fedlib.runs.grids import expand, results_frame, run_configs
from fedlib.runs.results import Results, ResultsTable
from fedlib.runs.scheduling import BATCH
from fedlib.runs.store import Store
from fedlib.runs.threads import check as check_threads


class NothingStoredError(LookupError):
    """``Experiment.table`` / ``frame`` of an experiment read with ``stored_only`` and none of its runs stored."""


@dataclass
class Experiment(Results):
    """A named experiment at one profile: what it runs and what came of it; a ``Results`` of its stored runs
    (``frame``, ``summary()``: its ``table``, ``plot()``).

    ``base``, ``grid``: the profile's base config and grid cells (flat names, the absent data sets' cells left
    out, ``seeds`` applied); ``configs``: the expanded configs (after ``where``); ``absent``: the data sets absent
    under the data root; ``inputs``: a step's output the grid took (FedMCSA Table 1: ``{'winners': ...}``) and
    ``after`` the experiment it was computed from. ``runs`` / ``missing_runs``: the configs with / without a stored
    result; ``table``: one summary row per run (``grids.run_configs``), ``frame``: per-round results
    (``grids.results_frame``), both over ``stored_runs()``: ``runs``, or, read with ``stored_only`` and none stored,
    a ``NothingStoredError`` that says so. ``store_for(cfg)``: where a setting is read or trained (``explore`` for one
    outside the grid). ``describe()`` (what ``print(ex)`` shows): configs, stored runs, absent data, what is missing
    or damaged."""

    name: str
    profile: str
    base: RunConfig
    grid: list
    configs: list
    absent: list
    store: Store
    stored_only: bool = False
    inputs: dict = field(default_factory=dict)
    after: "Experiment | None" = None
    explore: Store | None = None  # where settings outside the grid go (``store_for``); None: ``store``

    @property
    def runs(self) -> list[RunConfig]:
        return [c for c in self.configs if self.store.has(c)]

    @property
    def missing_runs(self) -> list[RunConfig]:
        return [c for c in self.configs if not self.store.has(c)]

    def store_for(self, cfg: RunConfig) -> Store:
        """Where ``cfg`` is read or trained: ``store`` for the experiment's own configs, ``explore`` for any other
        setting (notebook 00's panel), which ``fedlib.experiment`` makes the exploring profiles' store
        (``FEDLIB_RESULTS``, else the git-ignored results/_explore/) unless it was given a store, so that a setting
        tried beside the paper profile's grid is not stored among the committed paper runs."""
        own = cfg.key() in {c.key() for c in self.configs}
        return self.store if own or self.explore is None else self.explore

    @property
    def damaged(self) -> list[str]:
        """What is wrong with each damaged stored run among ``configs`` (they count as missing: left out of the
        tables, retrained by the next ``train``)."""
        return [p for c in self.configs if self.store.state(c) == "damaged" and (p := self.store.problem(c))]

    @property
    def unsealed(self) -> list[str]:
        """The stored runs among ``configs`` without a manifest that pass every other check: left out of the tables
        (they count as missing, and the next ``train`` replaces them) unless the store reads unsealed runs
        (``FEDLIB_READ_UNSEALED=1``; ``fedlib.runs.stored`` says why that is the user's choice)."""
        return [p for c in self.configs if self.store.state(c) == "unsealed" and (p := self.store.problem(c))]

    @property
    def columns(self) -> list[str]:
        """The fields the grid varies (the table's columns besides the summary)."""
        return list(dict.fromkeys(["algorithm", "seed"] + [k for cell in self.grid for k in cell]))

    def train(
        self,
        jobs: int | None = 1,
        progress: bool = True,
        backend="local",
        address: str | None = None,
        batch: int = BATCH,
        threads: int | None = None,
    ) -> "Experiment":
        """Train the configs not yet stored (``jobs`` at a time, up to ``batch`` runs as one model, or on a Ray
        cluster: ``backend='ray'``, ``address``; ``threads``: this process's; see ``grids.run_configs``) and keep
        the summary table."""
        self.__dict__["table"] = _table(
            self.configs, self.store, self.columns, progress=progress, jobs=jobs, backend=backend, address=address,
            batch=batch, threads=threads,
        )  # fmt: skip
        self.__dict__.pop("frame", None)
        return self

    @functools.cached_property
    def table(self) -> ResultsTable:
        return _table(self.stored_runs(), self.store, self.columns, progress=False)

    @functools.cached_property
    def frame(self) -> pd.DataFrame:
        return results_frame(self.stored_runs(), self.store)

    def stored_runs(self) -> list[RunConfig]:
        """``runs``, to draw: read with ``stored_only``, an experiment with configs and none of them stored has
        nothing to draw, and says so (``NothingStoredError``, naming the store and how to train them), rather than
        give an empty table without columns, on which a notebook would fail a cell later with a KeyError."""
        runs = self.runs
        if self.stored_only and self.configs and not runs:
            raise NothingStoredError(
                f"{self.name}, profile {self.profile}: none of its {len(self.configs)} runs is in the store "
                f"{self.store.root} (stored only: nothing trains); train them with STORED_ONLY = False in the "
                f"notebook, or python -m fedlib.experiments {self.name} --profile {self.profile}"
            )
        return runs

    def _pairs(self):
        return list(self.store.stored(self.stored_runs()))

    def summary(self) -> pd.DataFrame:
        """One summary row per stored run: ``table`` as a plain DataFrame (``ResultsTable.summary``)."""
        return self.table.summary()

    def describe(self) -> str:
        """What the experiment holds, as ``print(ex)`` shows it: configs, stored runs, data sets present and absent,
        the damaged and the missing runs."""
        sets = sorted({c.data.dataset for c in self.configs})
        lines = [
            f"{self.name}, profile {self.profile}: {len(self.configs)} configs, {len(self.runs)} with results"
            f"{' (stored only: nothing trains)' if self.stored_only else ''}; data sets: {', '.join(sets) or '-'}"
            f"; absent: {', '.join(self.absent) or 'none'}"
        ]
        damaged = self.damaged
        if damaged:
            lines.append(
                f"damaged, left out ({len(damaged)}; the next training run replaces them): " + "; ".join(damaged[:3])
            )
        unsealed = self.unsealed
        if unsealed:
            lines.append(
                f"unsealed, left out ({len(unsealed)}; FEDLIB_READ_UNSEALED=1 reads them): " + "; ".join(unsealed[:3])
            )
        missing = self.missing_runs
        if missing:
            lines.append(
                f"not in the store ({len(missing)}): "
                + "; ".join(c.label() for c in missing[:3])
                + (" ..." if len(missing) > 3 else "")
            )
        return "\n".join(lines)

    __str__ = describe

    def __repr__(self) -> str:
        return f"<Experiment {self.describe()}>"


def _table(cfgs: list[RunConfig], store: Store, columns, **kw) -> ResultsTable:
    """``grids.run_configs`` (trains what is not stored) with ``columns`` read by flat name (``cfg.get``), so a name
    that is also a typed part of the config (``model``) gives its flat value."""
    if not cfgs:
        return ResultsTable()
    table = run_configs(cfgs, store, columns=("seed",), **kw)
    for k in columns:
        table[k] = [c.get(k) for c in cfgs]
    return table


def _seeds(seeds) -> list:
    """``seeds`` as a list: an int is one seed (``-p SEEDS=0`` in a notebook); a string or another non-iterable is a
    ValueError (so ``seeds=0`` is not "'int' object is not iterable"; each seed's own value is checked by the
    config)."""
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        return [seeds]
    if isinstance(seeds, (str, bytes, dict)) or not hasattr(seeds, "__iter__"):
        raise ValueError(f"seeds={seeds!r} must be a list of integers, e.g. [0, 1, 2], or one integer")
    seeds = list(seeds)  # once: a generator or a range
    if not seeds:
        raise ValueError("seeds=[] is empty: give at least one seed, or None for the profile's")
    return seeds


WHERE = "{field: value or [values]} (e.g. {'seed': 0} or {'method.mu': [0.1, 1.0]}; fields flat or dotted) or None"


def _where(where: dict | None, name: str = "where") -> dict:
    """``where`` under flat names (dotted ones by their last component). Anything but a dict of field names to a
    value or a list of values is a ValueError naming the argument and what it takes, before anything trains: a
    string (``"seed=0"``, as on the command line) or a list of pairs failed deep inside with an AttributeError, and
    a set matched nothing (only a list is a set of accepted values). An unknown field is a ValueError too."""
    if where is None:
        return {}
    if not isinstance(where, dict):
        raise ValueError(f"{name}={where!r} is a {type(where).__name__}; it takes {WHERE}")
    out = {}
    for k, v in where.items():
        if not isinstance(k, str):
            raise ValueError(f"{name}={where!r}: the field {k!r} is not a field name (a str); it takes {WHERE}")
        if isinstance(v, (set, frozenset, dict)):
            raise ValueError(f"{name}[{k!r}]={v!r} is a {type(v).__name__}: give a value, or a list of values")
        out[flat_name(k)] = v
    return out


def _matches(cfg: RunConfig, where: dict) -> bool:
    # a list is a set of accepted values (as in grid cells); a tuple is one value (hidden sizes, a schedule)
    return all(cfg.get(k) in v if isinstance(v, list) else cfg.get(k) == v for k, v in where.items())


def _check_inputs(name: str, inputs) -> dict:
    """``inputs`` as a dict: None or ``{keyword: the step's output}`` for an experiment with a step (``profiles.STEPS``:
    ``{'winners': {(dataset, model, row): RunConfig}}``, what ``fedmcsa.table1_winners`` returns); anything else is a
    ValueError naming the argument and what it takes (a string of winners would be an AttributeError in the grid)."""
    if inputs is None:
        return {}
    step = profiles.STEPS.get(name)
    takes = (
        f"{{{step[1]!r}: the output of {step[2].__module__}.{step[2].__name__}, a dict of RunConfigs}} or None"
        if step
        else "None or {} (only an experiment with a step takes inputs: "
        + ", ".join(f"{n} takes {s[1]!r}" for n, s in profiles.STEPS.items())
        + ")"
    )
    if not isinstance(inputs, dict):
        raise ValueError(f"inputs={inputs!r}: experiment {name!r} takes {takes}")
    unknown = [k for k in inputs if step is None or k != step[1]]
    if unknown:
        raise ValueError(f"inputs={inputs!r}: experiment {name!r} takes no {unknown[0]!r}; it takes {takes}")
    for k, v in inputs.items():
        if not isinstance(v, dict) or not all(isinstance(c, RunConfig) for c in v.values()):
            raise ValueError(f"inputs[{k!r}]={v!r}: experiment {name!r} takes {takes}")
    return dict(inputs)


def experiment(
    name: str,
    profile: str | None = None,
    *,
    seeds=None,
    stored_only: bool = False,
    where: dict | None = None,
    fields: dict | None = None,
    jobs: int | None = 1,
    progress: bool = True,
    inputs: dict | None = None,
    store: Store | str | None = None,
    available: "profiles.Available | None" = None,
    backend="local",
    address: str | None = None,
    batch: int = BATCH,
    threads: int | None = None,
) -> Experiment:
    """Experiment ``name`` at ``profile`` (explicit beats env FEDLIB_PROFILE; default 'quick') over the data sets
    present: trained where not stored (``jobs`` at a time; None: one process per core, ``scheduling.default_jobs``), or
    with ``stored_only`` read from the store only (nothing trains; ``missing_runs`` lists the rest). ``seeds``: only
    these seeds (every cell's); ``where``: ``{field: value or [values]}``, fields flat or dotted (``method.mu``);
    ``fields``: values set in every cell (e.g. ``{'data_seed': 1}``; a list is an axis, as in grids). An experiment with
    a step (``profiles.STEPS``: FedMCSA Table 1's winners) first gets the experiment the step reads (trained unless
    ``stored_only``), then runs the step on the store, unless ``inputs`` gives its output (``{'winners': ...}``).
    ``store``: a ``Store`` or its root (default: ``FEDLIB_RESULTS``, else results/ for the paper profile and
    results/_explore/, git-ignored, for the others: ``fedlib.runs.store.default_root``); ``available``: the data sets to
    count as present (default: what is under the data root, ``fedlib.data.available.Available.scan()``). ``backend``:
    ``'local'`` (this machine, ``jobs`` processes) or ``'ray'`` (each unit of runs a task on the Ray cluster at
    ``address``, else ``RAY_ADDRESS``, else a local Ray instance; or a ``ray_backend.RayBackend``); this process stores
    the results either way. ``batch``: runs that share data, model and method train up to that many at a time as one
    model, each with its solo run's numbers (``fedlib.runs.batching``; 1: one at a time). ``threads``: what this
    process computes with (None: ``OMP_NUM_THREADS`` if set, else the cores other processes leave free:
    ``fedlib.runs.threads``)."""
    profile = resolve_profile(profile)
    grids.ray_backend(backend, address, jobs)  # bad values fail here, before any training
    check_threads(threads)
    where = _where(where)  # before the step below, which may train
    if fields is not None and not isinstance(fields, dict):
        raise ValueError(
            f"fields={fields!r} is a {type(fields).__name__}; it takes {{field: value or [values]}} or None"
        )
    if name not in profiles.EXPERIMENTS:
        raise ValueError(f"experiment={name!r} is not one of: {', '.join(profiles.EXPERIMENTS)}")
    if available is not None and not isinstance(available, profiles.Available):
        raise ValueError(
            f"available={available!r}: must be a fedlib.experiments.profiles.Available (the data sets to count as present, e.g. "
            "fedlib.experiments.profiles.Available.scan()) or None (what is under the data root)"
        )
    inputs, after = _check_inputs(name, inputs), None
    given, store = store, Store.of(store, profile)  # none given: paper runs in results/, others in results/_explore/
    available = available if available is not None else profiles.Available.scan()
    if name in profiles.STEPS:
        prior, keyword, step = profiles.STEPS[name]
        if keyword not in inputs:
            after = experiment(
                prior,
                profile,
                stored_only=stored_only,
                jobs=jobs,
                progress=progress,
                store=store,
                available=available,
                backend=backend,
                address=address,
                batch=batch,
            )
            inputs[keyword] = step(after.configs, store)
    base, grid = profiles.get(name, profile, available, **inputs)
    grid, absent = profiles.available_cells(profiles.flat_cells(grid), base, available)
    if seeds is not None:
        seeds = _seeds(seeds)
        grid = [{**cell, "seed": list(seeds)} for cell in grid]
    if fields:
        fields = profiles.flat_cells([fields])[0]
        grid = [{**cell, **fields} for cell in grid]
    every = expand(base, grid) if grid else []
    cfgs = [c for c in every if _matches(c, where)]
    if every and where and not cfgs:
        present = "; ".join(f"{k} in {{{', '.join(sorted({repr(c.get(k)) for c in every}))}}}" for k in where)
        raise ValueError(f"where={where} matches none of the {len(every)} configs of {name!r} ({present})")
    explore = store if given is not None else Store.of(None, "quick")  # the exploring profiles' default
    ex = Experiment(name, profile, base, grid, cfgs, absent, store, stored_only, inputs, after, explore)
    return ex if stored_only else ex.train(jobs, progress, backend, address, batch, threads)


def configs(name: str, profile: str | None = None, where: dict | None = None):
    """(configs, absent data sets) of experiment ``name`` at ``profile``; nothing trains."""
    ex = experiment(name, profile, where=where, stored_only=True, progress=False)
    return ex.configs, ex.absent


def status(profile: str | None = None, where: dict | None = None, store: Store | str | None = None):
    """One row per experiment at ``profile``: configs, stored, damaged (left out, retrained by the next run), unsealed
    (no manifest: left out unless ``FEDLIB_READ_UNSEALED=1``, retrained by the next run otherwise), to run,
    how far the interrupted runs got (they continue from there), the stored runs' wall hours (a run trained as one
    model with others counts its share: ``estimates.run_seconds``), absent data."""
    store, rows = Store.of(store, resolve_profile(profile)), []
    for name in sorted(profiles.EXPERIMENTS):
        ex = experiment(name, profile, where=where, stored_only=True, progress=False, store=store)
        cfgs, done = ex.configs, ex.runs
        hours = sum(estimates.run_seconds(m) for c in done if "wall_seconds" in (m := store.meta(c))) / 3600  # checked
        going = [i for c in cfgs if c not in done and (i := store.checkpoint(c).info())]
        rows.append(
            {
                "experiment": name,
                "configs": len(cfgs),
                "stored": len(done),
                "damaged": len(ex.damaged),
                "unsealed": len(ex.unsealed),
                "to run": len(cfgs) - len(done),
                "resumable (round/T)": ", ".join(f"{i['round']}/{i['rounds']}" for i in going),
                "stored wall h": round(hours, 1),
                "absent data": ", ".join(ex.absent) or ("" if cfgs else "all (no cells)"),
            }
        )
    return pd.DataFrame(rows)
