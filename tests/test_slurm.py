"""A real SLURM cluster on this machine (scripts/slurm-cluster.sh: munge, slurmctld and three
slurmd nodes in network namespaces; n1 CPU-only, n2 and n3 each with one "GPU", PoCL's OpenCL
device) with rgpu's prolog and epilog. Jobs on the CPU node use the GPU nodes' devices through
per-job rgpu servers, with nothing written by the user; SLURM's queue gives exclusivity, shards
give sharing; a killed job leaves its nodes clean; a node missing a device is drained.

As root only (namespaces, daemons); the cluster comes up once for the module and goes down at
its end, leaving nothing behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import rgpu_harness as h

SCRIPT = h.REPO / "scripts" / "slurm-cluster.sh"
DIR = Path("/run/rgpu-slurm-test")
NET = "10.77.9"
RUN_DIR = h.WORK / "slurm"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("slurmctld") is None,
                                reason="needs root and SLURM (scripts/setup.sh installs it)")


def cluster_env(**extra: str) -> dict:
    return h.base_env(SLURM_CONF=str(DIR / "etc" / "slurm.conf"),
                      RGPU_SLURM_STATE=str(DIR / "jobs"), RGPU_SLURM_DIR=str(DIR),
                      RGPU_SLURM_NET=NET, **extra)


def sh(cmd: list[str], timeout: float = 120, check: bool = True, **extra: str):
    # In the tests' work directory: sbatch writes its jobs' output where it is run.
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([str(c) for c in cmd], env=cluster_env(**extra), capture_output=True,
                       text=True, timeout=timeout, cwd=RUN_DIR)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))}: exit {r.returncode}\n"
                             f"{r.stdout}\n{r.stderr}\n{logs()}")
    return r


def logs() -> str:
    out = []
    for log in sorted((DIR / "log").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        out.append(f"--- {log}\n" + "\n".join(l for l in lines[-15:] if "pmix" not in l))
    return "\n".join(out)


def wait_for(what: str, predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s\n{logs()}")


def job_state(job: str) -> str:
    return sh(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()


def node_state(node: str) -> str:
    """The node's state as slurmctld has it: IDLE, MIXED, IDLE+DRAIN, ..."""
    shown = sh(["scontrol", "show", "node", node]).stdout
    return re.search(r"\bState=(\S+)", shown).group(1)


def no_jobs() -> bool:
    return sh(["squeue", "-h"]).stdout.strip() == ""


# How long jobs may take to leave the queue: a step's completion message that slurmctld does not
# take at once (a busy machine) is sent again by slurmd 60 s later, which the job waits out in
# COMPLETING.
DRAIN_TIMEOUT = 150


@pytest.fixture(scope="module")
def cluster(rgpu_bins):
    sh(["bash", SCRIPT, "down"], check=False)
    try:
        sh(["bash", SCRIPT, "up"], timeout=300)
    except AssertionError:
        # Nothing half-started may stay behind for the tests after this module.
        sh(["bash", SCRIPT, "down"], check=False)
        raise
    yield
    sh(["bash", SCRIPT, "down"], timeout=120)
    # Nothing left: no daemon of the cluster, no namespace, no link, no file.
    procs = subprocess.run(["pgrep", "-af", str(DIR)], capture_output=True, text=True).stdout
    assert procs.strip() == "", procs
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not re.search(r"\brgpu-n\d", netns), netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "rgpu-br" not in links and "rgpu-n1-h" not in links, links
    assert not DIR.exists()


@pytest.fixture(scope="module")
def example(cluster):
    out = RUN_DIR / "vector_add"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-o", str(out), str(h.REPO / "examples" / "vector_add.c"),
                    "-lOpenCL", "-lm"], check=True)
    return out


def test_status_shows_the_nodes(cluster):
    r = sh(["bash", SCRIPT, "status"])
    assert re.search(r"^n1\s+1\s+cpu\*\s+idle", r.stdout, re.M), r.stdout
    for node in ("n2", "n3"):
        assert re.search(rf"^{node}\s+1\s+gpu\s+idle", r.stdout, re.M), r.stdout


def test_a_job_on_the_cpu_node_uses_two_gpu_nodes(cluster, example):
    """A heterogeneous job: one task on n1, a GPU on each of n2 and n3. On n1, with no servers
    or token written anywhere by the user, `clinfo -l` lists exactly the job's two devices and
    the example runs on each of them (one task per device: RGPU_DEVICES_PER_RANK)."""
    rgpu = str(h.RGPU)
    r = sh(["salloc", "-Q", "-p", "cpu", "-N1", "-n2", ":", "-p", "gpu", "-N2", "--gres=gpu:1",
            "bash", "-c",
            f"{rgpu} cluster-status && "
            f"srun --het-group=0 -n1 {rgpu} devices && "
            f"srun --het-group=0 -n1 {rgpu} run -- clinfo -l && "
            f"RGPU_DEVICES_PER_RANK=1 EXAMPLE_PLATFORM=rgpu EXAMPLE_N=1048576 "
            f"srun --het-group=0 -n2 -l {rgpu} run -- {example}"], timeout=300)
    # cluster-status, from the submitting host: the job on all three nodes, its two servers
    # and their devices; then `rgpu devices` in the job's step, the same two.
    for node in ("n1", "n2", "n3"):
        assert re.search(rf"^{node}\s.*\b1 \(root, ", r.stdout, re.M), r.stdout
    assert re.search(r"^job 1 \(root\): rgpu servers 10\.77\.9\.12:\d+,10\.77\.9\.13:\d+$",
                     r.stdout, re.M), r.stdout
    servers = re.findall(r"\s(10\.77\.9\.1[23]):\d+\s*$", r.stdout, re.M)
    assert sorted(servers) == [f"{NET}.12", f"{NET}.12", f"{NET}.13", f"{NET}.13"], r.stdout
    rgpu_platform = re.search(r"Platform #\d+: rgpu\n((?:\s+[`+]-- Device.*\n)+)", r.stdout)
    assert rgpu_platform and len(rgpu_platform.group(1).splitlines()) == 2, r.stdout
    assert len(re.findall(r"^\d: result: OK", r.stdout, re.M)) == 2, r.stdout
    # The job's servers are gone with it, and so is its state.
    wait_for("the job's state removed", lambda: not any((DIR / "jobs").iterdir()))


def local_launch() -> list[str]:
    """mpirun's arguments to start its ranks on this node itself, not through SLURM: Open MPI
    4's `plm isolated`; Open MPI 5 (Debian 13) launches through PRRTE, which has no such
    component (mpirun crashed): leave out its SLURM launcher and allocation instead."""
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    major = re.search(r"Open MPI\)? (\d+)\.", version)
    if major and int(major.group(1)) >= 5:
        return ["--prtemca", "plm", "^slurm", "--prtemca", "ras", "^slurm"]
    return ["--mca", "plm", "isolated"]


def test_mpi_ranks_get_devices_of_their_own(cluster):
    """Two ranks of Debian's Open MPI in a job on the CPU node, each with one of the job's two
    GPUs (RGPU_DEVICES_PER_RANK=1, the rank from OMPI_COMM_WORLD_RANK): distinct servers."""
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun (scripts/setup.sh installs openmpi-bin)")
    r = sh(["salloc", "-Q", "-p", "cpu", "-N1", "-n2", ":", "-p", "gpu", "-N2", "--gres=gpu:1",
            "srun", "--het-group=0", "-n1", "mpirun", "--allow-run-as-root", "--oversubscribe",
            "-np", "2", *local_launch(), "--mca", "btl", "self,tcp",
            "--mca", "btl_tcp_if_include", "lo", h.RGPU, "devices"],
           timeout=300, RGPU_DEVICES_PER_RANK="1")
    print(r.stdout)
    devices = re.findall(r"^0\s.*\s(10\.77\.9\.1[23]):\d+\s*$", r.stdout, re.M)
    assert sorted(devices) == [f"{NET}.12", f"{NET}.13"], r.stdout
    assert not re.search(r"^1\s", r.stdout, re.M), "a rank saw more than its one device"


def test_the_prolog_ignores_files_planted_in_tmp(cluster):
    """A local user (nobody) plants symlinks, pointing at a file of root's, where an earlier
    prolog kept a file as root (/tmp/rgpu-prolog-JOB-NODE.gpus, job ids being predictable): the
    next jobs still get their servers, and the file and the links are untouched."""
    victim = DIR / "victim"
    victim.write_text("intact\n")
    config = sh(["scontrol", "show", "config"]).stdout
    next_job = int(re.search(r"^NEXT_JOB_ID\s*=\s*(\d+)", config, re.M).group(1))
    planted = [Path(f"/tmp/rgpu-prolog-{job}-n2.gpus") for job in range(next_job, next_job + 3)]
    try:
        for link in planted:
            subprocess.run(["runuser", "-u", "nobody", "--", "ln", "-sfn", str(victim), str(link)],
                           check=True)
        r = sh(["srun", "-p", "gpu", "--gres=gpu:1", "-w", "n2", h.RGPU, "devices"], timeout=120)
        assert re.search(rf"\s{NET}\.12:\d+\s*$", r.stdout, re.M), r.stdout + r.stderr
        assert victim.read_text() == "intact\n"
        assert all(link.is_symlink() for link in planted), "a planted link was removed"
    finally:
        for link in planted:
            link.unlink(missing_ok=True)
        victim.unlink()
    wait_for("no job left", no_jobs, timeout=DRAIN_TIMEOUT)


def test_a_second_job_for_the_same_gpu_waits_in_slurms_queue(cluster):
    first = sh(["sbatch", "--parsable", "-p", "gpu", "--gres=gpu:1", "-w", "n2",
                "--wrap", "sleep 20"]).stdout.strip()
    wait_for("the first job running", lambda: job_state(first) == "RUNNING")
    second = sh(["sbatch", "--parsable", "-p", "gpu", "--gres=gpu:1", "-w", "n2",
                 "--wrap", f"{h.RGPU} devices"]).stdout.strip()
    # Pending, and for the GPU (once the scheduler has looked at it).
    wait_for("the second job pending for resources",
             lambda: sh(["squeue", "-h", "-j", second, "-o", "%T %r"]).stdout.split()
             == ["PENDING", "Resources"])
    queue = sh(["squeue", "-o", "%.6i %.9P %.8T %.10r %N"]).stdout
    print(queue)
    assert re.search(rf"^\s*{second}\s+gpu\s+PENDING\s+Resources", queue, re.M), queue
    sh(["scancel", first])
    wait_for("the second job done", lambda: job_state(second) == "", timeout=90)
    wait_for("no job left", no_jobs, timeout=DRAIN_TIMEOUT)


def test_jobs_with_gpu_shards_share_the_gpu(cluster):
    outs = [RUN_DIR / f"shard-{i}.out" for i in range(2)]
    jobs = [sh(["sbatch", "--parsable", "-p", "gpu", "--gres=shard:2", "-w", "n3", "-o", out,
                "--wrap", f"{h.RGPU} devices && sleep 6"]).stdout.strip() for out in outs]
    wait_for("both shard jobs running at once",
             lambda: all(job_state(j) == "RUNNING" for j in jobs))
    wait_for("both done", no_jobs, timeout=DRAIN_TIMEOUT)
    for out in outs:
        text = out.read_text()
        assert re.search(rf"\s{NET}\.13:\d+\s*$", text, re.M), text


def test_a_killed_job_leaves_its_node_clean(cluster, c_program):
    isolation = c_program("isolation")
    job = sh(["sbatch", "--parsable", "-p", "gpu", "--gres=gpu:1", "-w", "n2", "--wrap",
              f"sleep 3600 | {h.RGPU} run -- {isolation} secret held"],
             RGPU_TEST_PLATFORM="rgpu").stdout.strip()
    wait_for("the job's session on the server",
             lambda: any("connected from" in p.read_text()
                         for p in (DIR / "log").glob(f"job-{job}-n2.log")))
    server_pid = int((DIR / "jobs" / job / "servers" / "n2.pid").read_text())
    sh(["scancel", "--signal=KILL", job])
    wait_for("the job gone", no_jobs, timeout=DRAIN_TIMEOUT)
    wait_for("the job's server stopped", lambda: not Path(f"/proc/{server_pid}").exists())
    wait_for("the job's state removed", lambda: not (DIR / "jobs" / job).exists())
    # Not drained: the epilog found the node clean.
    wait_for("n2 idle again", lambda: node_state("n2") == "IDLE", timeout=120)


def test_a_node_missing_a_device_is_drained(cluster):
    conf = DIR / "etc" / "rgpu-slurm.conf"
    original = conf.read_text()
    # n3's device "goes missing": the job's server is told to look for one that is not there.
    conf.write_text(original.replace('RGPU_SLURM_SERVER_ARGS="',
                                     'RGPU_SLURM_SERVER_ARGS="--devices no-such-device '))
    try:
        r = sh(["srun", "-p", "gpu", "--gres=gpu:1", "-w", "n3", "true"], check=False,
               timeout=120)
        assert r.returncode != 0, r.stdout + r.stderr
        reasons = sh(["sinfo", "-R", "-h", "-o", "%N|%E"]).stdout
        print(reasons)
        assert re.search(r"^n3\|rgpu: found 0 OpenCL devices and 0 CUDA GPUs, fewer than the "
                         r"1 expected", reasons, re.M), reasons
    finally:
        conf.write_text(original)
        sh(["scontrol", "update", "NodeName=n3", "State=RESUME"])
        sh(["scancel", "--user=root"], check=False)
    wait_for("n3 back", lambda: node_state("n3") == "IDLE", timeout=120)
