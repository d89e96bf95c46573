"""Live migration (docs/migration.md): a running OpenCL program's session moves from one real
server to another on PoCL (tests/opencl/migrate.c): buffers, kernels with their arguments,
events and a sampler keep their handles; buffer contents go server to server; the results
are those of the host's arithmetic. A move that cannot be made is refused with nothing
moved, and the program goes on where it was."""

import os
import subprocess
import time

import pytest

import rgpu_harness as h


def test_a_running_program_moves_to_another_server(start_server, c_program):
    origin, target = start_server(), start_server()
    # The program knows only the first server; it is moved to the second.
    r = h.run_rgpu(c_program("migrate"), [origin],
                   RGPU_TEST_MIGRATE_FROM=origin.endpoint,
                   RGPU_TEST_MIGRATE_TO=target.endpoint)
    h.assert_pass(r, "migrate", origin)
    assert f"moved from {origin.endpoint} to {target.endpoint}" in r.stdout, r.describe()
    # The contents went from the first server to the second over a fabric link.
    origin.wait_log(r"fabric link opened from", timeout=10)


def test_the_servers_operator_moves_a_running_program(start_server, c_program):
    """`rgpu migrate` on the server's host: the server tells its clients to move, and the
    program moves on a thread of its own while its threads keep calling."""
    origin, target = start_server(), start_server()
    env = h.base_env(RGPU_TEST_PLATFORM="rgpu", RGPU_TEST_MIGRATE_FROM=origin.endpoint,
                     RGPU_TEST_MIGRATE_TO=target.endpoint, RGPU_TEST_MIGRATE_BY="operator")
    program = subprocess.Popen(
        h.rgpu_run_cmd([origin], [c_program("migrate")]), env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        output = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = program.stdout.readline()
            if not line or line.strip() == "READY":
                break
            output.append(line)
        assert line.strip() == "READY", "".join(output)
        ordered = h.run([str(h.RGPU), "migrate", "--from", origin.endpoint,
                         "--to", target.endpoint], h.base_env(), timeout=60)
        assert ordered.returncode == 0, ordered.describe()
        assert "1 of 1 session(s)" in ordered.stdout, ordered.describe()
        # The program's session on the first server ends once it has moved.
        origin.wait_log(r"migrate\[\d+\] disconnected", timeout=60)
        rest, _ = program.communicate("go on\n", timeout=120)
    finally:
        if program.poll() is None:
            program.kill()
    output.append(rest)
    text = "".join(output)
    assert program.returncode == 0 and "PASS migrate" in text, text + origin.log_tail()
    target.wait_log(r"migrate\[\d+\] connected", timeout=10)


def test_only_the_servers_operator_may_order_a_move(server):
    """A client of another user on the server's host is refused, and nothing is told."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run `rgpu migrate` as another user")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    r = h.run(as_nobody + [str(h.RGPU), "migrate", "--from", server.endpoint,
                           "--to", "127.0.0.1:9"], h.base_env(), timeout=60)
    assert r.returncode != 0, r.describe()
    assert "takes move orders only from its operator" in r.stderr, r.describe()
    server.wait_log(r"not the server's operator; refused", timeout=10)
