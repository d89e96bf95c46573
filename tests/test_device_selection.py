"""Which devices a program sees (crates/client/src/selection.rs): RGPU_DEVICE_TYPES and
RGPU_DEVICE_FILTER hide devices, RGPU_DEVICES_PER_RANK gives each rank of a job devices of its
own. Two local servers each serve the machine's PoCL CPU device; `rgpu devices` lists what the
rgpu platform shows (the same ICD a program loads), with the server that holds each device."""

import re

import rgpu_harness as h


def shown(servers, **env) -> list[tuple[str, str]]:
    """(device name, server) of each device `rgpu devices` lists."""
    eps = ",".join(s.endpoint for s in servers)
    r = h.run([h.RGPU, "devices", "--servers", eps], h.base_env(**env), timeout=120)
    assert not r.timed_out, r.describe()
    if r.returncode != 0:
        # Nothing to list: the selection left no device, and says so.
        assert "the device selection" in r.stderr and env, r.describe()
        return []
    rows = []
    for line in r.stdout.splitlines():
        for server in servers:
            if server.endpoint in line:
                rows.append((line, server.endpoint))
    return rows


def test_types_names_and_ranks_select_devices(start_server):
    servers = [start_server(), start_server()]
    assert len(shown(servers)) == 2
    # PoCL's device is a CPU: asking for GPUs only hides it; CPUs show both.
    assert shown(servers, RGPU_DEVICE_TYPES="gpu") == []
    assert len(shown(servers, RGPU_DEVICE_TYPES="cpu,accelerator")) == 2
    assert shown(servers, RGPU_DEVICE_FILTER="no-such-device") == []
    assert len(shown(servers, RGPU_DEVICE_FILTER="NO-SUCH,pthread,cpu")) == 2
    # Two ranks, one device each: distinct servers' devices, whichever rank variable is set.
    rank0 = shown(servers, RGPU_DEVICES_PER_RANK="1", OMPI_COMM_WORLD_RANK="0")
    rank1 = shown(servers, RGPU_DEVICES_PER_RANK="1", SLURM_PROCID="1")
    assert len(rank0) == len(rank1) == 1
    assert rank0[0][1] != rank1[0][1], (rank0, rank1)
    # A rank beyond the job's devices sees none (and the log says why).
    assert shown(servers, RGPU_DEVICES_PER_RANK="1", PMI_RANK="2") == []


def test_a_program_runs_on_its_ranks_device(start_server, c_program):
    """Each rank's objects are made on its own device's server (the other server only answers
    the inventory: its session releases nothing)."""
    servers = [start_server(), start_server()]
    for rank in (0, 1):
        r = h.run_rgpu(c_program("buffers"), servers, RGPU_DEVICES_PER_RANK="1",
                       OMPI_COMM_WORLD_RANK=str(rank))
        h.assert_pass(r, "buffers", servers[rank])
        for index, server in enumerate(servers):
            server.wait_log(r"buffers\[\d+\] disconnected", count=rank + 1)
            released = re.findall(r"buffers\[\d+\] disconnected; released (\d+)", server.log())
            assert len(released) == rank + 1, server.log_tail()
            made_here = int(released[-1]) > 0
            assert made_here == (index == rank), (rank, index, server.log_tail())


def test_a_server_missing_devices_refuses_to_start():
    """`--expect-devices N`: a node with fewer devices than it should have says so and exits,
    instead of serving fewer (a cluster's prolog drains it)."""
    r = h.run([h.RGPU, "server", "--listen", "127.0.0.1:0", "--no-cuda", "--expect-devices", "2"],
              h.base_env(), timeout=60)
    assert r.returncode == 1, r.describe()
    assert "found 1 OpenCL devices and 0 CUDA GPUs, fewer than the 2 expected" in r.stderr, \
        r.describe()
    # Enough devices: it serves (stopped once it says where it listens).
    server = h.Server(args=["--expect-devices", "1"])
    try:
        assert server.alive()
    finally:
        server.stop()
