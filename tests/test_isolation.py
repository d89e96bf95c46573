"""A process per session: what one client does to its own session cannot reach another one.

Each test runs a healthy client that keeps a secret in a buffer on the server's CPU device
(PoCL) while other clients run a kernel that writes to an illegal address (a segfault of the
process running it) or one that reads the healthy client's buffer at its server address. The bad
sessions end (the client gets an error, the server logs which signal ended the session's
worker); the healthy client finishes with its secret intact, the server keeps serving."""

import re
import subprocess
import time

import rgpu_harness as h

SECRET = "RGPU-SECRET-4f1d8a"


def start_secret_keeper(c_program, server):
    """A client holding SECRET in a buffer; returns (process, the buffer's server address)."""
    cmd = h.rgpu_run_cmd([server], [c_program("isolation"), "secret", SECRET])
    proc = subprocess.Popen(cmd, env=h.base_env(RGPU_TEST_PLATFORM="rgpu"), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    address = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("ADDRESS "):
            address = line.split()[1]
        if line.strip() == "READY":
            return proc, address
    proc.kill()
    raise AssertionError(f"the secret keeper did not get ready:\n{server.log_tail()}")


def finish_secret_keeper(proc):
    out, _ = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0 and "OK" in out, out


def test_crashing_session_ends_alone(start_server, c_program):
    server = start_server()
    keeper, _ = start_secret_keeper(c_program, server)
    for attempt in range(2):
        r = h.run_rgpu(c_program("isolation"), [server], args=["crash"], timeout=120)
        assert not r.timed_out, r.describe()
        # The call returns (with the device-lost error) instead of hanging or crashing.
        assert "RETURNED -5" in r.stdout, r.describe() + server.log_tail()
    # The listener logs a worker's end when it reaps it, which may be just after the client saw
    # its connection close.
    crashes = server.wait_log(r"was killed by signal 11 \(SIGSEGV\)", count=2)
    assert crashes == 2, server.log_tail()
    assert server.alive()
    finish_secret_keeper(keeper)
    # New sessions are served as before.
    h.assert_pass(h.run_rgpu(c_program("buffers"), [server]), "buffers", server)


def test_build_options_that_crash_pocl_are_refused(start_server, c_program):
    # clBuildProgram(..., "-D", ...) segfaults PoCL's compiler: the client library refuses it
    # at once, and so does the server for a request that comes without the library's check.
    server = start_server()
    r = h.run_rgpu(c_program("isolation"), [server], args=["badoptions"], timeout=120)
    assert "RETURNED -43" in r.stdout, r.describe()  # CL_INVALID_BUILD_OPTIONS
    assert "killed by signal" not in server.log(), server.log_tail()


def test_a_kernel_cannot_read_another_sessions_buffer(start_server, c_program):
    server = start_server()
    keeper, address = start_secret_keeper(c_program, server)
    assert address, "no address printed"
    r = h.run_rgpu(c_program("isolation"), [server], args=["peek", address, "32"], timeout=120)
    assert not r.timed_out, r.describe()
    assert SECRET not in r.stdout + r.stderr, "another session's buffer was read:\n" + r.stdout
    assert server.alive()
    finish_secret_keeper(keeper)


def test_thread_isolation_is_opt_in(start_server, c_program):
    # `--isolation thread` serves sessions in the listener's process (for debugging); the
    # default is a process per session.
    server = start_server(args=["--isolation", "thread"])
    assert "no session isolation" in server.log(), server.log_tail()
    h.assert_pass(h.run_rgpu(c_program("buffers"), [server]), "buffers", server)
    default = start_server()
    assert "no session isolation" not in default.log(), default.log_tail()


def worker_uids(server) -> set[int]:
    """The real uids of a server's session workers."""
    uids = set()
    for pid in server.worker_pids():
        with open(f"/proc/{pid}/status") as f:
            uids.update(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    return uids


def test_a_root_servers_workers_never_run_as_root(start_server, c_program):
    """A server run as root with no worker_user runs its session workers as an unprivileged
    user (the package's `rgpu`, else a uid of systemd's dynamic range with a private home),
    from a build a user other than root cannot reach (this checkout, under /root in CI); with
    `--worker-user root`, as root, as asked."""
    import os
    import pwd

    import pytest
    if os.geteuid() != 0:
        pytest.skip("needs a server running as root")
    server = start_server()
    h.assert_pass(h.run_rgpu(c_program("buffers"), [server]), "buffers", server)
    uids = worker_uids(server)
    assert uids and 0 not in uids, f"workers as {uids}\n{server.log_tail()}"
    try:
        expected = pwd.getpwnam("rgpu").pw_uid
    except KeyError:
        (expected,) = uids
        assert 61184 <= expected <= 65519, uids
        assert re.search(rf"run as rgpu-worker-{expected} \(uid {expected}", server.log()), \
            server.log_tail()
    assert uids == {expected}, uids
    assert "session workers run as" in server.log(), server.log_tail()
    server.stop()
    as_root = start_server(args=["--worker-user", "root"])
    h.assert_pass(h.run_rgpu(c_program("buffers"), [as_root]), "buffers", as_root)
    assert worker_uids(as_root) == {0}
    assert "session workers run as root" in as_root.log(), as_root.log_tail()


def test_workers_run_as_the_worker_user(start_server, c_program):
    """A server run as root starts its session workers as worker_user (here `nobody`), so the
    code that serves clients' requests never holds root."""
    import os
    import pwd
    import shutil

    import pytest
    if os.geteuid() != 0:
        pytest.skip("needs a server running as root")
    import tempfile
    nobody = pwd.getpwnam("nobody")
    # PoCL keeps compiled kernels in a cache directory its user must be able to write; the
    # listener (root) loads PoCL too, so the directory is made for both beforehand.
    cache = tempfile.mkdtemp(prefix="rgpu-nobody-cache-")
    os.makedirs(os.path.join(cache, "pocl", "kcache"))
    for dirpath, _, _ in os.walk(cache):
        os.chown(dirpath, nobody.pw_uid, nobody.pw_gid)
    os.chmod(cache, 0o777)
    env = h.base_env(XDG_CACHE_HOME=cache)
    # Workers run the server's own executable, through a descriptor the listener keeps: the
    # build need not be where nobody can reach it (a clone under /root is not).
    server = start_server(args=["--worker-user", "nobody"], env=env)
    h.assert_pass(h.run_rgpu(c_program("buffers"), [server]), "buffers", server)
    assert worker_uids(server) == {nobody.pw_uid}
    server.stop()
    shutil.rmtree(cache, ignore_errors=True)
