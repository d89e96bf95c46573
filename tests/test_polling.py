"""Waits that poll before they sleep (RGPU_SPIN_US; on by default only on machines with 8
cores or more, so CI's small machines would never take the polling paths): the client's and
the server's socket reads and the client's reply waits, forced on here, through real servers
on TCP and on a Unix socket, with real OpenCL programs on PoCL."""

import pytest

import rgpu_harness as h

POLL = {"RGPU_SPIN_US": "200"}


def server_env(**extra):
    return {**h.base_env(), **extra}


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
@pytest.mark.parametrize("name", ["events", "buffers", "kernels"])
def test_programs_pass_with_polling_waits(c_program, start_server, unix, name):
    server = start_server(unix=unix, env=server_env(**POLL))
    r = h.run_rgpu(c_program(name), [server], **POLL)
    h.assert_pass(r, name, server)


def test_polling_can_be_turned_off_where_it_would_be_on(c_program, start_server):
    off = {"RGPU_SPIN_US": "0"}
    server = start_server(env=server_env(**off))
    r = h.run_rgpu(c_program("compute"), [server], **off)
    h.assert_pass(r, "compute", server)
