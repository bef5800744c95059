"""Write ``fedlib/runs/round_seconds.json`` (``fedlib.runs.estimates.reference_times``: this version's seconds a round
per kind of run, what ``make notebooks``' plan and a grid's balancing estimate runs from when the store holds none of
their kind) from a store the quick profile filled from empty on the reference machine (a 2-core CPU):

    FEDLIB_RESULTS=/tmp/quick FEDLIB_DATA=<root> make notebooks PROFILE=quick
    python scripts/reference_timings.py /tmp/quick

Run it again when a change makes rounds faster or slower; the file records the CPUs, commits and thread counts its
runs were timed with.
"""

from __future__ import annotations

import argparse

from fedlib.runs import estimates


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", help="the store folder the quick profile filled")
    ap.add_argument("--out", default=None, help=f"the file to write (default {estimates.REFERENCE_TIMES})")
    args = ap.parse_args(argv)
    doc = estimates.write_reference_times(args.store, args.out)
    out = args.out or estimates.REFERENCE_TIMES
    print(f"{out}: {len(doc['seconds_a_round'])} kinds from {doc['runs']} runs ({', '.join(doc['cpus'])})")


if __name__ == "__main__":
    main()
