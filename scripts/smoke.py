"""The installed wheel on its own: run in a fresh virtualenv that holds nearrec and numpy only
(`make wheel-smoke`, CI). A store from numpy, lookups from DRAM and from SSD against numpy's
sums, the CLI's build / info / lookup / verify, and the optional extras missing as a user
without them would meet it: one line, no traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import nearrec

assert importlib.util.find_spec("torch") is None, "the smoke test runs without torch"
print("nearrec", nearrec.__version__, "from", Path(nearrec.__file__).parent)

with tempfile.TemporaryDirectory() as tmp:
    rng = np.random.default_rng(0)
    users = rng.standard_normal((1000, 16), dtype=np.float32)
    nearrec.from_numpy(Path(tmp) / "s", {"users": users})
    ids, offsets = np.array([1, 2, 3, 999]), np.array([0, 2])
    want = np.stack([users[[1, 2]].sum(0), users[[3, 999]].sum(0)])
    for tier in ("dram", "ssd"):
        store = nearrec.open(Path(tmp) / "s", tier=tier)
        np.testing.assert_allclose(store.lookup("users", ids, offsets), want, rtol=1e-6)
    try:
        store.lookup("users", np.array([1000]), np.array([0]))
        raise AssertionError("an id past the table was not refused")
    except nearrec.IndexOutOfRange as e:
        assert e.table == "users" and e.position == 0, e

    def cli(*args: str, ok: bool = True) -> str:
        done = subprocess.run([sys.executable, "-m", "nearrec.cli", *args],
                              capture_output=True, text=True)
        assert (done.returncode == 0) == ok, (args, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        return done.stdout + done.stderr

    m = str(Path(tmp) / "m")
    cli("build", m, "--model", "rmc1", "--rows", "2000")
    print(cli("info", m).splitlines()[0])
    print(cli("lookup", m, "--tier", "ssd", "--repeat", "3").splitlines()[0])
    cli("verify", m)
    # a model kept with the store (a program of one linear layer over table users' sums)
    # runs in the engine on real inputs: no torch
    config = ('{"model": "graph", "tables": ["users"], "graph": {"dense": 0, "ops": [{"op": '
              '"linear", "input": [[1, 0, 16]], "weight": "w"}], "output": [[2, 0, 1]]}}')
    w = np.ones((1, 16), np.float32)
    nearrec._native.model_save(str(Path(tmp) / "s"), config, [("w", w)])
    np.savez(Path(tmp) / "in.npz", users=np.array([[1, 2], [3, 999]]))
    print(cli("predict", str(Path(tmp) / "s"), "--inputs", str(Path(tmp) / "in.npz"),
              "--out", str(Path(tmp) / "p.npy")).strip())
    np.testing.assert_allclose(np.load(Path(tmp) / "p.npy")[:, 0], want.sum(1), rtol=1e-5)
    # what needs torch says so in one line, with the install that brings it
    trace = str(Path(tmp) / "t.nrtrace")
    cli("trace", "gen", trace, "--store", m, "--bags", "64")
    line = cli("infer", m, trace, ok=False).strip()
    assert line.endswith("pip install 'nearrec[torch]'"), line
    print(line)
print("smoke test passed")
