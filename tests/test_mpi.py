"""rgpu's MPI interposer (librgpu_mpi.so, `rgpu run --mpi`) with Debian's Open MPI: real
`mpirun` ranks, each using an OpenCL device of a real rgpu server on PoCL, passing OpenCL
buffers (marked by their datatype) to MPI point-to-point calls and collectives."""

import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rgpu_harness as h

ROOT = Path(__file__).resolve().parent.parent
MPI_DIR = Path(__file__).resolve().parent / "mpi"


@pytest.fixture(scope="module")
def mpi_programs(rgpu_bins):
    """Builds librgpu_mpi.so beside the other rgpu libraries, and the test programs."""
    if shutil.which("mpicc") is None or shutil.which("mpirun") is None:
        pytest.skip("no mpicc/mpirun (scripts/setup.sh installs openmpi-bin and libopenmpi-dev)")
    out = h.RGPU.parent
    r = subprocess.run(["bash", str(ROOT / "scripts/build-mpi.sh"), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    h.WORK.mkdir(parents=True, exist_ok=True)
    programs = {}
    for name in ("mpi_buffers", "mpi_lost_server"):
        exe = h.WORK / name
        r = subprocess.run(["mpicc", "-O1", "-g", "-Wall", "-Wextra", "-o", str(exe),
                            str(MPI_DIR / f"{name}.c"), f"-L{out}", "-lrgpu_mpi",
                            f"-Wl,-rpath,{out}", "-lOpenCL"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        programs[name] = exe
    return programs


def output_of(proc, timeout):
    """The output of an mpirun started by `mpirun`; past `timeout` its whole session (mpirun,
    `rgpu run` and the ranks) is killed, so a hung rank fails this test only."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def mpirun(ranks, servers, program, timeout=300, **env):
    """`program` (a path, or a command as a list) on `ranks` ranks under `rgpu run --mpi`."""
    eps = ",".join(s.endpoint for s in servers)
    command = [str(a) for a in program] if isinstance(program, list) else [str(program)]
    # Every rank is on this machine: TCP over loopback only (Open MPI 5, Debian 13's, finds no
    # "reachable pairing" over some hosts' other interfaces).
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
           "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
           str(h.RGPU), "run", "--mpi", "--servers", eps, "--", *command]
    return subprocess.Popen(cmd, env=h.base_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.parametrize("ranks,direct", [(2, "1"), (4, "1"), (2, "0")])
def test_opencl_buffers_through_mpi(start_server, mpi_programs, ranks, direct):
    """Device<->device, device<->host, many concurrent Isend/Irecv, Sendrecv, Bcast and
    Allreduce on OpenCL buffers of two servers, every result read back from the devices;
    large messages moved between the servers directly (and, with RGPU_MPI_DIRECT=0, all
    staged). The servers' logs show the direct pulls, over fabric links opened once and
    reused."""
    servers = [start_server(env={"RGPU_LOG": "debug"}) for _ in range(2)]
    proc = mpirun(ranks, servers, mpi_programs["mpi_buffers"], RGPU_MPI_DIRECT=direct)
    out = output_of(proc, 300)
    print(out)
    assert proc.returncode == 0, out
    for rank in range(ranks):
        assert f"PASS mpi_buffers rank {rank}" in out, out
    links = sum(s.log().count(f"data lane {2**32 - 1} joined") for s in servers)
    served = sum(s.log().count("bytes of an export") for s in servers)
    if direct == "1":
        assert served > 0, "no direct pulls between the servers"
        # Links are kept and reused: far fewer opened than transfers they carried.
        assert 0 < links < served, f"{links} fabric links opened for {served} transfers"
    else:
        assert links == 0 and served == 0, f"{served} direct pulls with RGPU_MPI_DIRECT=0"


def test_the_interposer_works_in_a_program_that_opens_mpi_later(start_server, mpi_programs):
    """Python with mpi4py opens libmpi privately, after the preloaded interposer is loaded: it
    loads (it once failed there: `undefined symbol: ompi_mpi_comm_world`) and its PMPI calls find
    the MPI library the program opened privately (`undefined symbol: PMPI_Init`)."""
    server = start_server()
    proc = mpirun(2, [server], [sys.executable, MPI_DIR / "late_mpi.py"])
    out = output_of(proc, 300)
    print(out)
    assert proc.returncode == 0, out
    for rank in range(2):
        assert f"PASS late_mpi rank {rank}" in out, out


def test_a_lost_server_is_an_mpi_error_not_a_hang(start_server, mpi_programs, tmp_path):
    """Rank 0's server is killed before it sends from a buffer there: MPI_Send returns an MPI
    error within seconds (with a message), and both ranks finish."""
    doomed, other = start_server(), start_server()
    go = tmp_path / "go"
    proc = mpirun(2, [doomed, other], mpi_programs["mpi_lost_server"], RGPU_TEST_GO=str(go))
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("READY"):
            doomed.stop(signal.SIGKILL)
            go.touch()
            break
    out = "".join(lines) + output_of(proc, 120)
    print(out)
    assert "SEND_ERROR" in out, out
    seconds = float(out.split("SEND_ERROR")[1].split("after")[1].split()[0])
    assert seconds < 30, out
    assert "rgpu: reading an OpenCL buffer failed" in out, out
    assert "RECV_DONE" in out, out


def test_rgpu_bench_mpi_runs(mpi_programs, tmp_path):
    """`rgpu bench mpi` (two local servers started by it) prints its table and writes JSON and
    an SVG plot with host and device figures for every size (speed is not asserted)."""
    json_out, svg_out = tmp_path / "bench.json", tmp_path / "bench.svg"
    r = subprocess.run([str(h.RGPU), "bench", "mpi", "--iterations", "5",
                        "--latency-sizes", "8,4096", "--bandwidth-sizes", "65536,1048576",
                        "--json", str(json_out), "--svg", str(svg_out)],
                       env=h.base_env(), capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "host (MB/s)" in r.stdout and "direct (MB/s)" in r.stdout, r.stdout
    import json
    report = json.loads(json_out.read_text())
    got = {(m["mode"], m["test"], m["bytes"]) for m in report["measurements"]}
    for mode in ("host", "staged", "direct"):
        for size in (8, 4096):
            assert (mode, "latency", size) in got, got
        for size in (65536, 1048576):
            assert (mode, "bandwidth", size) in got, got
    assert svg_out.read_text().count("<polyline") == 3
