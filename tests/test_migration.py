"""Live migration (docs/migration.md): a running OpenCL program's session moves from one real
server to another on PoCL (tests/opencl/migrate.c): buffers, kernels with their arguments,
events and a sampler keep their handles; buffer contents go server to server; the results
are those of the host's arithmetic. A move that cannot be made is refused with nothing
moved, and the program goes on where it was."""

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
