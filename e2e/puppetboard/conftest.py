"""Session fixtures for the Puppetboard e2e tests.

e2e/run starts a pdbmux in front of the fixture's backends and a Puppetboard (gunicorn) pointed at
it, and hands them over as E2E_PDBMUX_URL and E2E_PUPPETBOARD_URL (with their log
files in E2E_PDBMUX_LOG and E2E_PUPPETBOARD_LOG). Without those variables (running
pytest by hand after `source e2e/.state/env.sh`), the fixtures start both themselves: pdbmux from
E2E_BIN (default target/debug/pdbmux) and Puppetboard from this interpreter's virtualenv.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from support import Estate, Http

HERE = Path(__file__).resolve().parent
E2E = HERE.parent
ROOT = E2E.parent
# Wide enough that fixture reports never count as "unreported" by age, however old the load.
UNRESPONSIVE_HOURS = "87600"


def var(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def state_dir() -> Path:
    return Path(var("E2E_STATE") or E2E / ".state")


@pytest.fixture(scope="session")
def estate() -> Estate:
    path = Path(var("E2E_FIXTURE") or state_dir() / "fixture.json")
    if not path.is_file():
        pytest.fail(f"{path} does not exist: run e2e/run (or e2e/run --backends-only and "
                    "`source e2e/.state/env.sh`) first", pytrace=False)
    fixture = json.loads(path.read_text())
    spec = var("E2E_BACKENDS")
    if spec is None:
        pytest.fail("E2E_BACKENDS is not set: run through e2e/run, or "
                    "`source e2e/.state/env.sh`", pytrace=False)
    given = [part.strip().split("=", 1) for part in spec.split(",") if part.strip()]
    names = [name for name, _ in given]
    loaded = [b["name"] for b in fixture["backends"]]
    if names != loaded:
        pytest.fail(f"E2E_BACKENDS names {names} differ from the fixture's {loaded}",
                    pytrace=False)
    # The URLs given now are authoritative (the fixture records the ones it was loaded through).
    fixture["backends"] = [{"name": n, "url": u.rstrip("/")} for n, u in given]
    return Estate(fixture)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def pdbmux(estate: Estate):
    """pdbmux's base URL: the harness's, or one started here for the session."""
    url = var("E2E_PDBMUX_URL")
    if url is not None:
        yield Http(url, "pdbmux", log=var("E2E_PDBMUX_LOG"))
        return
    binary = Path(var("E2E_BIN") or ROOT / "target/debug/pdbmux")
    if not binary.is_absolute():
        binary = ROOT / binary
    if not binary.is_file():
        pytest.fail(f"no pdbmux binary at {binary}: cargo build -p pdbmux-runtime-tokio, or set "
                    "E2E_BIN", pytrace=False)
    home = tempfile.mkdtemp(prefix="pdbmux-e2e-pb-home-")
    log_dir = state_dir() / "pdbmux-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"puppetboard-pytest-{os.getpid()}.log"
    port = _free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "XDG_CONFIG_HOME": os.path.join(home, ".config"),
        "NO_COLOR": "1",
        "PDBMUX_BACKENDS": ",".join(f"{n}={estate.urls[n]}" for n in estate.order),
        "PDBMUX_LISTEN": f"127.0.0.1:{port}",
        "PDBMUX_METRICS_LISTEN": "",
        "PDBMUX_HEALTH_PROBE_ENABLED": "false",
        "PDBMUX_LOG_LEVEL": "debug",
    }
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(binary), "serve"], env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                pytest.fail(f"pdbmux exited ({proc.returncode}); log: {log_path}", pytrace=False)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"pdbmux not listening after 20s; log: {log_path}", pytrace=False)
                time.sleep(0.05)
        yield Http(f"http://127.0.0.1:{port}", "pdbmux", log=str(log_path))
    finally:
        _stop(proc)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def board(pdbmux: Http):
    """Puppetboard's base URL: the harness's, or one started here for the session."""
    url = var("E2E_PUPPETBOARD_URL")
    if url is not None:
        yield Http(url, "Puppetboard", log=var("E2E_PUPPETBOARD_LOG"))
        return
    run = Path(tempfile.mkdtemp(prefix="pdbmux-e2e-puppetboard-"))
    log_path = run / "gunicorn.log"
    bind = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, PUPPETBOARD_UNRESPONSIVE_HOURS=UNRESPONSIVE_HOURS)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(HERE / "serve"), sys.prefix, pdbmux.base, bind, str(run)],
                                env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(f"http://{bind}/status", timeout=5).text == "OK":
                    break
            except requests.RequestException:
                pass
            text = log_path.read_text(errors="replace")
            if proc.poll() is not None or "exited with code" in text or time.monotonic() > deadline:
                pytest.fail(f"Puppetboard did not come up on {bind}:\n{text[-3000:]}",
                            pytrace=False)
            time.sleep(0.3)
        yield Http(f"http://{bind}", "Puppetboard", log=str(log_path))
    finally:
        _stop(proc)
        shutil.rmtree(run, ignore_errors=True)
