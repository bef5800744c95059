"""``make lab`` explores working copies: saving a notebook through JupyterLab's server (what autosave does) changes
the copy in build/lab/, never the committed notebook nbval compares against."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import lab  # noqa: E402


def test_prepare_copies_once_and_again_when_fresh(tmp_path):
    src = tmp_path / "notebooks"
    src.mkdir()
    (src / "00_a.ipynb").write_text("committed")
    copies = tmp_path / "lab"
    assert lab.prepare(copies, notebooks=src) == [copies / "00_a.ipynb"]
    (copies / "00_a.ipynb").write_text("my edit")
    assert lab.prepare(copies, notebooks=src) == [] and (copies / "00_a.ipynb").read_text() == "my edit"
    assert lab.prepare(copies, fresh=True, notebooks=src) == [copies / "00_a.ipynb"]
    assert (copies / "00_a.ipynb").read_text() == "committed" and (src / "00_a.ipynb").read_text() == "committed"
    tracker = copies / ".settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    assert json.loads(tracker.read_text()) == {"autoStartDefaultKernel": True}
    cmd = lab.command(copies, port=8890)
    assert f"--ServerApp.root_dir={copies}" in cmd and "--ServerApp.port=8890" in cmd
    with pytest.raises(SystemExit):
        lab.main(["--port", "99999", "--dry-run"])


@pytest.mark.ports
def test_saving_in_the_lab_leaves_the_committed_notebooks_as_they_are(tmp_path):
    committed = ROOT / "notebooks" / "00_quickstart.ipynb"
    before = committed.read_bytes()
    copies = tmp_path / "lab"
    lab.prepare(copies)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
           "--IdentityProvider.token=t", f"--ServerApp.root_dir={copies}", "--allow-root"]  # fmt: skip
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    url = f"http://127.0.0.1:{port}/api/contents/00_quickstart.ipynb"
    try:
        for _ in range(120):
            try:
                nb = json.load(
                    urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "token t"}))
                )
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the Jupyter server did not answer")
        nb["content"]["cells"][0]["source"] += "\nan edit"
        body = json.dumps({"type": "notebook", "format": "json", "content": nb["content"]}).encode()
        put = urllib.request.Request(url, data=body, method="PUT", headers={"Authorization": "token t"})
        assert urllib.request.urlopen(put).status == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "an edit" in (copies / "00_quickstart.ipynb").read_text()
    assert committed.read_bytes() == before
    status = subprocess.run(["git", "status", "--porcelain", "notebooks"], cwd=ROOT, capture_output=True, text=True)
    assert status.stdout == ""
