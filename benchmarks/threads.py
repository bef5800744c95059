"""The thread count fedlib chooses against one and two threads, with and without a competing process.

``python -m benchmarks.threads`` trains each workload in a fresh process for every way (``default``: fedlib
chooses, ``OMP_NUM_THREADS`` unset; ``threads=1``; ``threads=2``), alone and beside a competing process (one thread
of matrix products, what another user's job looks like to the run), ways alternated, and prints the median seconds
a round of each and how far the default is from the best way of its row. The first round (data loading, warm-up)
is not timed. ``--tiny``: one repeat of two rounds (the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORKLOADS = {  # the README's example, and FedMCSA on Fashion-MNIST (the setting of the slow script)
    "readme": dict(dataset="synthetic", model="dnn", hidden=(20,), algorithm="fedprox", mu=0.1),
    "fmnist_fedmcsa": dict(dataset="fmnist", partition="labels", model="dnn", algorithm="fedmcsa", n_clients=20),
}
WAYS = {"default": None, "threads=1": 1, "threads=2": 2}

_CHILD = """
import json, sys, time
import fedlib
spec, threads, rounds = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
cfg = fedlib.RunConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}, rounds=1)
fedlib.train(cfg, progress=False, threads=threads)  # loads the data, warms up
t = time.perf_counter()
res = fedlib.train(cfg.replace(rounds=rounds), progress=False, threads=threads)
print(json.dumps({"s": (time.perf_counter() - t) / rounds, "threads": res.meta["threads"],
                  "by": res.meta["threads_by"], "seen": res.meta.get("threads_seen")}))
"""

_HOG = """
import torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
while True:
    a = (a @ a).tanh_()
"""


def _one(spec: dict, threads: int | None, rounds: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(spec), json.dumps(threads), str(rounds)],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"the run of {spec} with threads={threads} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(workloads: dict, rounds: int, repeats: int) -> list[dict]:
    """One row per (workload, competing process or not, way): median seconds a round and the threads it used."""
    rows = []
    for competing in (False, True):
        hog = subprocess.Popen([sys.executable, "-c", _HOG]) if competing else None
        try:
            if hog is not None:
                time.sleep(1.0)  # the competitor is computing before the first run starts
            for name, spec in workloads.items():
                times: dict[str, list] = {w: [] for w in WAYS}
                last: dict[str, dict] = {}
                for _ in range(repeats):
                    for way, threads in WAYS.items():  # alternated, so a slow spell hits every way
                        last[way] = _one(spec, threads, rounds)
                        times[way].append(last[way]["s"])
                for way in WAYS:
                    rows.append({"workload": name, "competing": competing, "way": way,
                                 "s_round": statistics.median(times[way]), "threads": last[way]["threads"],
                                 "by": last[way]["by"], "seen": last[way]["seen"]})  # fmt: skip
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    return rows


def table(rows: list[dict]) -> str:
    """The rows as text, each default row with its ratio to the best way of its workload and load."""
    lines = [f"{'workload':16} {'competing':9} {'way':10} {'s/round':>9} {'threads':>7}  vs best"]
    for r in rows:
        peers = [q["s_round"] for q in rows if (q["workload"], q["competing"]) == (r["workload"], r["competing"])]
        ratio = f"{r['s_round'] / min(peers):.2f}x" if r["way"] == "default" else ""
        seen = f" (seen {r['seen']})" if r["seen"] else ""
        lines.append(
            f"{r['workload']:16} {str(r['competing']):9} {r['way']:10} {r['s_round']:9.4f} {r['threads']:>7}  "
            f"{ratio}{seen}"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.threads", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds of each run (after one untimed)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each way (median)")
    ap.add_argument("--tiny", action="store_true", help="the README's workload, 2 rounds, 1 repeat (tests)")
    args = ap.parse_args(argv)
    workloads = {"readme": WORKLOADS["readme"]} if args.tiny else WORKLOADS
    rounds, repeats = (2, 1) if args.tiny else (args.rounds, args.repeats)
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} before the first run", flush=True)
    print(table(measure(workloads, rounds, repeats)))


if __name__ == "__main__":
    main()
