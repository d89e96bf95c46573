"""Each C program of tests/opencl (one per OpenCL API group) must print `PASS <group>` both
natively on the local platform (PoCL) and through rgpu (`rgpu run` against a real server
process on a loopback port). A failure shows the program's FAIL line (file:line, the call, the
error code) and the server's log."""

import pytest

import rgpu_harness as h


@pytest.mark.parametrize("mode", ["native", "rgpu"])
@pytest.mark.parametrize("group", h.GROUPS)
def test_group(group, mode, c_program, request):
    prog = c_program(group)
    if mode == "native":
        r = h.run_native(prog)
        h.assert_pass(r, group)
        return
    server = request.getfixturevalue("server")
    r = h.run_rgpu(prog, [server])
    h.assert_pass(r, group, server)
    assert server.alive(), f"server died after {group}\n{server.log_tail()}"


def test_verdicts_are_the_implementations(c_program, server):
    """Where the API leaves the answer to the implementation (a work-group over the kernel's
    CL_KERNEL_WORK_GROUP_SIZE but within the device's limit), rgpu answers what the
    implementation does: the `VERDICT` lines of the native and the rgpu run are the same."""
    prog = c_program("kernels")
    native, remote = h.run_native(prog), h.run_rgpu(prog, [server])
    h.assert_pass(native, "kernels")
    h.assert_pass(remote, "kernels", server)

    def verdicts(run):
        return [line for line in run.stdout.splitlines() if line.startswith("VERDICT")]

    assert verdicts(native), native.stdout
    assert verdicts(remote) == verdicts(native), (remote.stdout, native.stdout)


@pytest.mark.parametrize("group", ["buffers", "images_samplers"])
def test_group_over_unix_socket(group, c_program, start_server):
    server = start_server(unix=True)
    assert server.endpoint.startswith("unix:"), server.endpoint
    r = h.run_rgpu(c_program(group), [server])
    h.assert_pass(r, group, server)


def test_devices_of_two_servers(c_program, start_server):
    """With two servers, the rgpu platform lists a device of each; platform_device checks every
    device (CL_DEVICE_RGPU_SERVER names its own server) and runs a kernel."""
    a, b = start_server(), start_server()
    r = h.run_rgpu(c_program("platform_device"), [a, b])
    h.assert_pass(r, "platform_device", a)


def test_one_session_after_another(c_program, server):
    """A server serves many sessions in a row; each one's objects are freed."""
    prog = c_program("images_samplers")
    for _ in range(3):
        h.assert_pass(h.run_rgpu(prog, [server]), "images_samplers", server)
    assert server.alive()
