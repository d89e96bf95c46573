"""pytest fixtures for the rgpu integration tests (see rgpu_harness.py).

Tests that need the rgpu binaries ask for the `rgpu_bins`, `server` or `start_server`
fixtures and are skipped, with the reason, when `rgpu` / `librgpu_opencl.so` are not built.
The native (PoCL) runs of the C programs need only gcc and an OpenCL platform.
"""

import shutil
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rgpu_harness as h  # noqa: E402

# tests/work holds build outputs and logs.
collect_ignore = ["work"]


def pytest_sessionstart(session):
    # Server logs of earlier runs (kept for a day, for looking into failures).
    logs = h.WORK / "logs"
    if logs.is_dir():
        cutoff = time.time() - 86400
        for f in logs.glob("server-*.log"):
            try:
                if f.stat().st_mtime < cutoff:
                    f.unlink()
            except OSError:
                pass


def pytest_report_header(config):
    missing = h.missing_binaries()
    return [f"rgpu build dir: {h.BUILD_DIR}" + (f" ({missing})" if missing else ""),
            f"native platform: {h.NATIVE_PLATFORM}; per-program timeout {h.PROGRAM_TIMEOUT:.0f}s"]


@pytest.fixture(scope="session")
def gcc():
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: the C test programs cannot be built")
    return "gcc"


@pytest.fixture(scope="session")
def rgpu_bins():
    missing = h.missing_binaries()
    if missing:
        pytest.skip(missing)
    return h.RGPU


@pytest.fixture
def start_server(rgpu_bins):
    """Factory: start_server(token_file=None, unix=False, args=(), env=None, listen=...) ->
    running Server (listen=None: where its --config file says).
    Every server started is stopped at teardown."""
    servers = []

    def start(token_file=None, unix=False, args=(), env=None, listen="127.0.0.1:0",
              program=None):
        s = h.Server(token_file=token_file, unix=unix, args=tuple(args), env=env, listen=listen,
                     program=program)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def server(start_server):
    """One running server on a free loopback port."""
    return start_server()


@pytest.fixture(scope="session")
def c_program(gcc):
    """c_program(name) -> path of the built tests/opencl/<name>.c."""
    return h.build_c
