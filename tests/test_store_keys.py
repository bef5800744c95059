"""Every run committed under results/ keeps its key: its flat config.json loads into the typed config, validates,
and hashes to the name of its folder (the store is users' data)."""

import json
import subprocess
from pathlib import Path

import pytest

from fedlib.config.run import from_dict
from fedlib.runs.stored import LEGACY_KEYS

RESULTS = Path(__file__).resolve().parents[1] / "results"
# Stored before domain_percent applied only to feature-shift data (its config says mnist with domain_percent=0.1,
# a field the run never read); its key was computed by the schema of that time. adafl_fig3's FedAvg-0.1 cell reads it
# by that key, so it stays a result: the store accepts its config under that folder name alone (``LEGACY_KEYS``;
# tests/test_store_tamper.py checks the pair).
ORPHANS = set(LEGACY_KEYS)


def _stored():
    """The committed runs' config files: those git tracks (runs a user trained at the paper profile beside them are
    theirs, not the user guide's count), or every run folder's outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", "*/config.json"], cwd=RESULTS, capture_output=True, check=True
        ).stdout
        tracked = [RESULTS / name for name in out.decode().split("\0") if name.count("/") == 1]
    except (OSError, subprocess.CalledProcessError):
        tracked = []
    found = tracked or RESULTS.glob("*/config.json")
    return sorted(p for p in found if not p.parent.name.startswith("_"))


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ beside the package")
def test_every_stored_key_is_unchanged():
    paths = _stored()
    assert len(paths) >= 634
    wrong = []
    for p in paths:
        key = p.parent.name
        if key in ORPHANS:
            continue
        d = json.loads(p.read_text())
        cfg = from_dict(d).validate()
        if cfg.key() != key:
            wrong.append((key, cfg.key()))
        flat = cfg.flat()  # the flat view reproduces the file, field by field
        assert all(flat[k] == (tuple(v) if isinstance(v, list) else v) for k, v in d.items()), key
    assert wrong == []


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ beside the package")
def test_the_orphan_is_refused_by_name():
    for key in ORPHANS:
        d = json.loads((RESULTS / key / "config.json").read_text())
        with pytest.raises(ValueError, match="domains/domain_percent set but dataset='mnist'"):
            from_dict(d).validate()


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ beside the package")
def test_the_user_guide_counts_the_runs_that_keep_their_key():
    """The user guide (docs/user-guide.md, "The results store") quotes how many stored runs keep their key, which must
    be the store's count."""
    n = len(_stored()) - len(ORPHANS)
    guide = (RESULTS.parent / "docs" / "user-guide.md").read_text()
    assert f"Every one of the {n} stored runs keeps its key" in " ".join(guide.split())


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ beside the package")
def test_git_never_converts_the_stored_runs_line_endings(tmp_path):
    """A stored run is checked byte for byte against its manifest, so a checkout that turns its line endings into CRLF
    (``core.autocrlf=true``, Git for Windows' default) would make every committed run read as damaged and retrain:
    ``.gitattributes`` marks results/ as not text."""
    import shutil
    import subprocess

    from fedlib.runs.store import Store

    key = next(p.parent.name for p in _stored() if p.parent.name not in ORPHANS)
    files = [f"results/{key}/{name}" for name in ("config.json", "metrics.csv", "meta.json", "manifest.json")]
    try:
        out = subprocess.run(["git", "check-attr", "text", "--", *files], cwd=RESULTS.parent, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert out.splitlines() == [f"{f}: text: unset" for f in files]
    # what the attribute prevents: the same run with CRLF line endings is damaged
    store = Store(tmp_path)
    shutil.copytree(RESULTS / key, tmp_path / key)
    cfg = from_dict(json.loads((RESULTS / key / "config.json").read_text()))
    assert store.problem(cfg) is None
    csv = tmp_path / key / "metrics.csv"
    csv.write_bytes(csv.read_bytes().replace(b"\n", b"\r\n"))
    assert "metrics.csv" in store.problem(cfg)


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ beside the package")
def test_the_committed_figures_data_sets_are_the_stores():
    """``plotting.COMMITTED_DATA`` (a figure drawn without one of these is saved as ``.partial.png``, never over a
    committed figure) names the data sets of the committed runs."""
    from fedlib.plotting import COMMITTED_DATA

    stored = {json.loads(p.read_text()).get("dataset", "synthetic") for p in _stored()}
    assert stored == COMMITTED_DATA


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ beside the package")
def test_what_the_store_writes_beside_the_committed_runs_is_ignored(tmp_path):
    """The folders the store keeps beside its runs (an interrupted write, a snapshot, a damaged run set aside, the
    exploring profiles' runs) never show up in ``git status`` as if they were results to commit (``_damaged`` did),
    and a run folder does."""
    import subprocess

    from fedlib.config.run import RunConfig
    from fedlib.runs import store

    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=1, model="mlr")
    s = store.Store(tmp_path)
    written = [
        s.checkpoint(cfg).path,  # _partial/<key>.pt
        s.root / store.EXPLORE / cfg.key() / "metrics.csv",
        s.root / "_tmp-0123456789abcdef-xyz" / "config.json",  # Store.save's tempfile.mkdtemp prefix
    ]
    s.root.joinpath(cfg.key()).mkdir()
    with pytest.warns(store.DamagedRunWarning):
        written.append(s._set_aside(s.root / cfg.key()) / "metrics.csv")  # _damaged/<key>-<time>-<pid>
    names = [f"results/{p.relative_to(tmp_path).as_posix()}" for p in written]
    try:
        ignored = [subprocess.run(["git", "check-ignore", "-q", n], cwd=RESULTS.parent).returncode for n in names]
        run = subprocess.run(["git", "check-ignore", "-q", f"results/{cfg.key()}/metrics.csv"], cwd=RESULTS.parent)
    except OSError:
        pytest.skip("no git")
    if run.returncode == 128:
        pytest.skip("not a git checkout")
    assert dict(zip(names, ignored)) == dict.fromkeys(names, 0) and run.returncode == 1
