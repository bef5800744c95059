"""What ``fedlib.run``, ``fedlib.run_grid`` (``run_configs``) and ``fedlib.experiment`` return: a ``Results``, the
configs of some runs and their per-round metrics, with one way to look at them whichever call made them:

- ``frame``: the tidy per-round frame, one row per (run, evaluated round): the metrics columns
  (``fedlib.core.state.COLUMNS``), the run's ``key`` and every field of its config (what ``results_frame`` gives);
- ``summary()``: one row per config: the best, last (``final_acc``) and mean of the last 10 evaluated rounds of the
  sample-weighted and unweighted accuracies, the global model's, uploads, seconds, divergence
  (``RunResult.summary``); a best-on-validation column only where the metrics hold a validation split (none of
  fedlib's protocols holds one out: the papers pick their best round on the test set);
- ``plot(metric=..., by=...)``: the metric's curves over rounds, one per value of ``by`` (mean over seeds with a
  ± 1 std band), rounds on integer ticks.

Three classes share that base rather than one new class replacing the old return values, because code written
against the old ones must keep working (the notebooks, the papers' modules, the tests, users' scripts):

- one run: ``RunResults``, a ``RunResult`` (``res.metrics``, ``res.client_acc``, ``res.traces``, ... as before);
  its ``summary()`` stays the dict ``RunResult.summary`` returns (its one row, read as ``res.summary()["best_acc"]``);
- a grid: ``ResultsTable``, a pandas DataFrame subclass that *is* the summary table run_grid returned (its columns,
  rows, indexing, ``groupby``, ``pd.concat`` unchanged) and carries each row's config and store (by its ``key``
  column), so that a filtered table (``table[table.mu == 0.1]``) still knows its runs;
- a named experiment: ``fedlib.experiments.named.Experiment`` (``ex.table`` is a ``ResultsTable``, ``ex.frame`` as
  before).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from fedlib import plotting
from fedlib.config.run import RunConfig
from fedlib.core.state import COLUMNS, FAILURE_COLUMNS, NEW_COLUMNS, VAL_COLUMNS, RunResult
from fedlib.runs.store import Store

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Pairs = list[tuple[RunConfig, RunResult]]


def tidy_frame(pairs: Iterable[tuple[RunConfig, RunResult]]) -> pd.DataFrame:
    """One row per (run, evaluated round): the run's metrics, its ``key`` and its config's fields (tuples as strings,
    so that the frame groups and compares by them)."""
    frames = [
        res.metrics.assign(
            key=cfg.key(), **{k: str(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items()}
        )
        for cfg, res in pairs
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def summary_row(cfg: RunConfig, res: RunResult, columns: Sequence[str] = ()) -> dict[str, Any]:
    """A run's row of a summary table: its key, the fields its config changes, ``columns`` (flat names, read with
    ``cfg.get`` even where they keep their defaults) and ``res.summary()``."""
    return {"key": cfg.key(), **cfg.changed(), **{k: cfg.get(k) for k in columns}, **res.summary()}


class Results:
    """The configs of some runs and their per-round metrics: ``frame``, ``summary()``, ``plot()`` (the module's
    docstring says why one run, a grid and an experiment are three subclasses). A subclass gives ``configs`` and
    ``_pairs()``, the stored (config, result) of its runs."""

    def _pairs(self) -> Pairs:
        raise NotImplementedError

    @property
    def frame(self) -> pd.DataFrame:
        """Per-round metrics of every run, one row per (run, evaluated round), with its key and config's fields."""
        return tidy_frame(self._pairs())

    def summary(self) -> Any:
        """One row per config (``summary_row``): best, final and last-10 accuracies, uploads, seconds, divergence."""
        return pd.DataFrame([summary_row(cfg, res) for cfg, res in self._pairs()])

    def plot(self, metric: str = "test_acc", by: str | Sequence[str] | None = None, title: str = "",
             zoom: bool = False) -> Figure:  # fmt: skip
        """The curves of ``metric`` (a metrics column: ``test_acc``, ``test_acc_mean``, ``global_test_acc``,
        ``test_loss``, ...) over rounds, one per value of ``by`` (a config field or a list of them, flat names; None:
        the fields in which the runs differ, seeds apart, else the algorithm), each the mean over the runs that share
        it (the seeds) with a ± 1 std band, rounds on integer ticks (``plotting.accuracy_curves``). ``zoom``: an
        accuracy axis shows the range after the first tenth of the rounds. Returns the figure."""
        return curves(self.frame, metric, by, title, zoom)


def curves(frame: pd.DataFrame, metric: str = "test_acc", by=None, title: str = "", zoom: bool = False) -> Figure:
    """``Results.plot`` on a tidy frame (``tidy_frame``); a bad ``metric`` or ``by`` is a ValueError naming what the
    frame holds, raised before anything is drawn."""
    if frame.empty:
        raise ValueError("nothing to plot: none of these runs is stored (train them first, e.g. fedlib.run_grid)")
    metrics = [
        c for c in frame.columns if c in (*COLUMNS, *VAL_COLUMNS, *NEW_COLUMNS, *FAILURE_COLUMNS) and c != "round"
    ]
    if not isinstance(metric, str) or metric not in metrics:
        raise ValueError(f"metric={metric!r} is not a metrics column; one of: {', '.join(metrics)}")
    fields = [
        c for c in frame.columns if c not in (*COLUMNS, *VAL_COLUMNS, *NEW_COLUMNS, *FAILURE_COLUMNS) and c != "key"
    ]
    if by is None:
        by = [c for c in fields if c != "seed" and frame[c].nunique(dropna=False) > 1] or ["algorithm"]
    names = [by] if isinstance(by, str) else list(by) if isinstance(by, (list, tuple)) else None
    if not names or not all(isinstance(n, str) and n in fields for n in names):
        raise ValueError(f"by={by!r} must be a config field or a list of them (flat names), e.g. one of: "
                         f"{', '.join(fields[:12])}, ...")  # fmt: skip
    if len(names) == 1:
        hue = names[0]
    else:  # one curve per combination, labelled "name=value, ..."
        hue = ", ".join(names)
        frame = frame.assign(**{hue: [", ".join(f"{n}={v}" for n, v in zip(names, row))
                                      for row in frame[names].itertuples(index=False)]})  # fmt: skip
    return plotting.accuracy_curves(frame, hue=hue, metrics=(metric,), title=title, zoom=zoom)


class RunResults(RunResult, Results):
    """One run's result, as ``fedlib.run`` returns it: a ``RunResult`` (``metrics``, ``client_acc``, ``traces``,
    ``config``, ...) and a ``Results`` of that one run. ``summary()`` is ``RunResult.summary``'s dict, the run's row
    of a summary table (code written against ``RunResult`` reads ``res.summary()["best_acc"]``)."""

    summary = RunResult.summary  # type: ignore[assignment]

    @classmethod
    def of(cls, result: RunResult, cfg: RunConfig) -> RunResults:
        """``result`` (its arrays shared, not copied) as the ``RunResults`` of ``cfg``."""
        if isinstance(result, cls) and result.config is cfg:
            return result
        fields = {k: getattr(result, k) for k in RunResult.__dataclass_fields__}
        return cls(**{**fields, "config": cfg})

    @property
    def configs(self) -> list[RunConfig]:
        return [self.config] if isinstance(self.config, RunConfig) else []

    def _pairs(self) -> Pairs:
        return [(cfg, self) for cfg in self.configs]


class _TablePlot:
    """``ResultsTable.plot``: called with at most ``metric``, ``by``, ``title`` and ``zoom``, the curves over rounds
    (``Results.plot``); with anything else (``kind=``, ``x=``, ``y=``, positional arguments) and as an accessor
    (``table.plot.bar(...)``), pandas' own ``DataFrame.plot``, as before the table was a ``Results``."""

    OURS = frozenset({"metric", "by", "title", "zoom"})

    def __init__(self, table: ResultsTable):
        self._table = table

    def _pandas(self):
        return pd.plotting.PlotAccessor(self._table)

    def __call__(self, *args, **kw):
        if args or not set(kw) <= self.OURS:
            return self._pandas()(*args, **kw)
        return Results.plot(self._table, **kw)

    def __getattr__(self, name: str):
        return getattr(self._pandas(), name)


class _PlotDescriptor:
    def __get__(self, table, owner=None):
        return self if table is None else _TablePlot(table)


class ResultsTable(pd.DataFrame, Results):
    """The summary table of a grid (``run_configs``, ``run_grid``, ``Experiment.table``): one row per config, as
    before, and a ``Results`` of its rows' runs. Each row's config and store are kept by its ``key`` column
    (``_metadata``, carried through pandas' row selections, copies and ``pd.concat``), so ``frame``, ``summary()``,
    ``plot()`` and ``configs`` follow the rows a table holds: ``table[table.algorithm == "fedprox"].plot()`` draws
    FedProx's runs. A frame without the ``key`` column (a selection of other columns) has no runs and says so.

    A DataFrame subclass, not a new object beside the table, because the table is what code has always indexed,
    grouped and concatenated (``table.best_acc``, ``table.groupby(...)``, ``pd.testing.assert_frame_equal``).
    ``plot`` keeps pandas' accessor (``table.plot.bar``, ``table.plot(x=, y=)``, see ``_TablePlot``); the per-round
    frame is ``frame``, not ``rounds``, which a column of that name (a grid over ``rounds``) would shadow."""

    _metadata = ["_runs"]
    plot = _PlotDescriptor()  # type: ignore[assignment]

    @property
    def _constructor(self):
        return ResultsTable

    @classmethod
    def of_rows(cls, rows: list[dict], runs: Iterable[tuple[RunConfig, Store]]) -> ResultsTable:
        """A table of summary ``rows`` (each with the ``key`` of one of ``runs``: (config, store))."""
        table = cls(rows)
        table._runs = {cfg.key(): (cfg, store) for cfg, store in runs}
        return table

    def __finalize__(self, other, method=None, **kw):  # type: ignore[override]
        out = super().__finalize__(other, method, **kw)
        if not isinstance(other, pd.DataFrame) and hasattr(other, "input_objs"):  # pd.concat: the inputs' runs
            runs: dict = {}
            for o in other.input_objs:
                runs.update(getattr(o, "_runs", None) or {})
            object.__setattr__(out, "_runs", runs)
        return out

    def _run_map(self) -> dict[str, tuple[RunConfig, Store]]:
        return getattr(self, "_runs", None) or {}

    def _keys(self) -> list[str]:
        if self.empty:
            return []
        if "key" not in self.columns:
            raise ValueError(
                "this table has no 'key' column, so it does not know its runs: select rows, not columns "
                "(table[table.algorithm == 'fedavg']), then take .frame, .summary() or .plot()"
            )
        keys = list(dict.fromkeys(self["key"]))
        unknown = [k for k in keys if k not in self._run_map()]
        if unknown:
            raise ValueError(f"rows with key {unknown[0]!r} come from no run this table was made of (a row added by "
                             "hand?): build the table with fedlib.run_grid / run_configs")  # fmt: skip
        return keys

    @property
    def configs(self) -> list[RunConfig]:
        """The configs of the table's rows, in row order."""
        runs = self._run_map()
        return [runs[k][0] for k in self._keys()]

    @property
    def store(self) -> Store | None:
        """The store the table's runs were read from (the first one's, where a concatenation mixes stores)."""
        stores = [s for _, s in self._run_map().values()]
        return stores[0] if stores else None

    def _pairs(self) -> Pairs:
        runs, out = self._run_map(), []
        for k in self._keys():
            cfg, store = runs[k]
            out.extend(store.stored([cfg]))
        return out

    def summary(self) -> pd.DataFrame:
        """The table's rows as a plain DataFrame: the table is the summary (``summary_row`` per config)."""
        return pd.DataFrame(self)
