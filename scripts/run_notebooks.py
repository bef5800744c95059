"""The main job: execute every notebook headlessly with papermill, skipping those whose data is absent.

    python scripts/run_notebooks.py [--profile quick] [--only 00,03] [-p NAME=V1,V2 ...] [--out build/notebooks]

Executed copies go to ``build/notebooks/``; the notebooks themselves write figures to
``figures/`` and results to the store (``results/``), so a second run re-draws from the
store without retraining. ``-p NAME=V1,V2`` passes papermill parameters; comma lists expand
to a grid (one executed copy per combination). A notebook lists the data sets it needs in
its metadata (``metadata.fedlib.requires``); when one is absent it is reported and skipped.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=None, help="smoke | quick | paper (default: FEDLIB_PROFILE or quick)")
    ap.add_argument("--only", default="", help="comma-separated notebook number prefixes, e.g. 00,03")
    ap.add_argument("-p", "--param", action="append", default=[], help="papermill parameter NAME=VALUE[,VALUE...]")
    ap.add_argument("--out", default=str(ROOT / "build" / "notebooks"))
    ap.add_argument("--dir", default=str(ROOT / "notebooks"), help="folder of the numbered notebooks")
    args = ap.parse_args(argv)

    import papermill as pm

    from fedlib.config import resolve_profile
    from fedlib.data import readers

    profile = resolve_profile(args.profile)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = [s for s in args.only.split(",") if s]
    notebooks = sorted(p for p in Path(args.dir).glob("[0-9]*.ipynb") if not only or p.name.startswith(tuple(only)))
    print(f"profile={profile}, data root={readers.data_root()}, {len(notebooks)} notebook(s) -> {out}")
    status = {}
    for nb in notebooks:
        needs = json.loads(nb.read_text()).get("metadata", {}).get("fedlib", {}).get("requires", [])
        missing = readers.missing(needs)
        if missing:
            status[nb.name] = f"skipped: data absent ({', '.join(missing)}; see data/README.md)"
            print(f"SKIP {nb.name}: {status[nb.name]}")
            continue
        for params in _grid(args.param):
            suffix = "".join(f"_{k}-{v}" for k, v in params.items())
            target = out / f"{nb.stem}{suffix}.{profile}.ipynb"
            t0 = time.time()
            print(f"RUN  {nb.name} {params or ''} -> {target.name}", flush=True)
            try:
                pm.execute_notebook(
                    str(nb),
                    str(target),
                    parameters={"PROFILE": profile, **params},
                    cwd=str(nb.parent),
                    kernel_name="python3",
                    progress_bar=False,
                )
                status[f"{nb.name}{suffix}"] = f"ok ({time.time() - t0:.0f} s)"
            except Exception as e:  # report and go on: one failing notebook must not hide the others
                status[f"{nb.name}{suffix}"] = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"     {status[f'{nb.name}{suffix}']}", flush=True)
    print("\nsummary:")
    for k, v in status.items():
        print(f"  {k:45} {v}")
    return 1 if any(v.startswith("FAILED") for v in status.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
