"""Exclusive use (`rgpu server --sharing exclusive`): one application at a time has the
server's devices. Its own sessions come in; another application's waits its turn (told so) or,
if it asked not to wait, is refused with the reason; the turn passes when the holder's last
session ends. Real server on PoCL, real clients through `rgpu run`."""

import subprocess
import time

import rgpu_harness as h


def test_another_application_is_refused_when_it_will_not_wait(start_server, c_program):
    server = start_server(args=["--sharing", "exclusive"])
    holder = h.hold_session(c_program("isolation"), server)
    try:
        r = h.run_rgpu(c_program("platform_device"), [server], timeout=60,
                       RGPU_EXCLUSIVE_WAIT="0")
        assert not r.timed_out and r.returncode != 0, r.describe()
        assert "exclusive use by application" in r.stderr, r.describe()
        assert "RGPU_EXCLUSIVE_WAIT=0" in r.stderr, r.describe()
    finally:
        holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0
    # The devices come back with the holder's session (its worker ends a moment after the
    # holder did: the next application waits that moment, no more).
    h.assert_pass(h.run_rgpu(c_program("platform_device"), [server], RGPU_EXCLUSIVE_WAIT="60"),
                  "platform_device", server)


def test_another_application_waits_its_turn(start_server, c_program):
    server = start_server(args=["--sharing", "exclusive"])
    holder = h.hold_session(c_program("isolation"), server)
    waiter = None
    try:
        waiter = subprocess.Popen(
            h.rgpu_run_cmd([server], [c_program("platform_device")]),
            env=h.base_env(RGPU_TEST_PLATFORM="rgpu", RGPU_TEST_EXPECT_SERVER=server.endpoint,
                           RGPU_TEST_NATIVE_COMPARE=h.NATIVE_PLATFORM,
                           RGPU_EXCLUSIVE_WAIT="120"),
            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        server.wait_log(r"waits up to 120 s for exclusive use", timeout=30)
        # Queued, not refused: still waiting while the holder holds.
        time.sleep(1.0)
        assert waiter.poll() is None, "the second application did not wait"
    finally:
        holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0 and "PASS platform_device" in out, out + err
    assert "is in exclusive use by another application; waiting" in err, err
    assert "has the devices now" in server.log(), server.log_tail()


def test_sessions_of_one_application_share_the_devices(start_server, c_program):
    server = start_server(args=["--sharing", "exclusive"])
    holder = h.hold_session(c_program("isolation"), server, RGPU_APP_ID="job-7")
    try:
        r = h.run_rgpu(c_program("platform_device"), [server], timeout=60,
                       RGPU_APP_ID="job-7", RGPU_EXCLUSIVE_WAIT="0")
        h.assert_pass(r, "platform_device", server)
    finally:
        holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0
