"""One OpenCL context over devices of two servers (VirtualCL's single view of a cluster):
tests/opencl/spanning.c through two real servers on PoCL. Kernels on each server pass buffers
between them, a queue waits on the other server's event, buffers are copied, migrated and
partly rewritten across servers, a sub-buffer read where its parent was not, every result
checked on the host; the bytes move server to server (a fabric link opens between them),
never through the program."""

import rgpu_harness as h


def test_one_context_over_two_servers(start_server, c_program):
    servers = [start_server(), start_server()]
    r = h.run_rgpu(c_program("spanning"), servers)
    h.assert_pass(r, "spanning", servers[0])
    # Each server pulled from the other over a fabric link (the client moved no bytes).
    for server in servers:
        server.wait_log(r"fabric link opened from", timeout=10)


def test_a_context_over_one_server_is_unchanged(server, c_program):
    """The same program with one server: it needs two, and says so rather than passing."""
    r = h.run_rgpu(c_program("spanning"), [server])
    assert r.returncode != 0, r.describe()
    assert "devices of two servers are needed" in r.stdout + r.stderr, r.describe()
