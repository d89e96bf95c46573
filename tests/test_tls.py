"""TLS: programs run through TLS 1.3 sessions (data lanes included), a client refuses a server
whose certificate it was not told to trust and says which one it saw, a server refuses
plaintext where it wants TLS, and a server's key pair is made once and kept.

Test servers share one identity (made by rgpu_harness in tests/work/tls) and every client the
harness starts pins it; RGPU_TLS=on makes loopback connections use TLS too."""

import os
import re
import stat

import rgpu_harness as h


def devices(server, **env):
    return h.run([h.RGPU, "devices", "--servers", server.endpoint], env=h.base_env(**env),
                 timeout=60)


def test_programs_run_over_tls_with_data_lanes(server, c_program):
    """OpenCL groups and 64 MiB writes (striped over the data lanes, each its own TLS
    connection) through TLS on loopback."""
    for group in ["buffers", "kernels"]:
        r = h.run_rgpu(c_program(group), [server], RGPU_TLS="on")
        h.assert_pass(r, group, server)
    r = h.run_rgpu(c_program("stress_write"), [server], args=["64", "3", "write"],
                   RGPU_TLS="on", RGPU_LANES="4")
    assert not r.timed_out and r.returncode == 0, r.describe() + server.log_tail()
    assert "WROTE 3" in r.stdout, r.describe()
    log = server.log()
    connected = re.findall(r"connected from \S+( \(TLS\))?", log)
    assert connected and all(connected), log[-3000:]
    # The data lanes came through TLS as well (their handshakes are logged at debug level;
    # what shows here is that no plaintext connection was made at all).
    assert "refused" not in log, log[-3000:]


def test_an_untrusted_server_is_refused_naming_its_fingerprint(server):
    fingerprint = h.tls_fingerprint()
    wrong = "sha256:" + "00" * 32
    r = devices(server, RGPU_TLS="on", RGPU_TLS_FINGERPRINT=wrong)
    assert r.returncode != 0, r.describe()
    assert f"the server's certificate {fingerprint} is none of those RGPU_TLS_FINGERPRINT " \
           "names" in r.stderr, r.describe()
    assert server.endpoint in r.stderr, r.describe()
    # No pin at all: the message says what to check and what to set.
    r = devices(server, RGPU_TLS="on", RGPU_TLS_FINGERPRINT="")
    assert r.returncode != 0, r.describe()
    assert f"RGPU_TLS_FINGERPRINT={fingerprint}" in r.stderr, r.describe()
    # The server logs the refused handshake and goes on.
    assert server.wait_log(r"refused: TLS handshake: .*Certificate"), server.log_tail()
    r = devices(server, RGPU_TLS="on")
    assert r.returncode == 0, r.describe()


def test_a_server_that_wants_tls_refuses_plaintext(start_server):
    server = start_server(args=["--plaintext", "never"])
    r = devices(server)  # RGPU_TLS=auto: plaintext on loopback
    assert r.returncode != 0, r.describe()
    assert "accepts TLS connections only" in r.stderr, r.describe()
    r = devices(server, RGPU_TLS="on")
    assert r.returncode == 0, r.describe()


def test_a_client_that_asks_for_plaintext_gets_it_only_where_allowed(server):
    """RGPU_TLS=off to a loopback server: accepted (plaintext = "local", the default)."""
    r = devices(server, RGPU_TLS="off")
    assert r.returncode == 0, r.describe()
    assert "(TLS)" not in server.log(), server.log_tail()


def test_the_key_pair_is_made_at_first_start_and_kept(start_server, tmp_path):
    cert, key = tmp_path / "tls" / "server.crt", tmp_path / "tls" / "server.key"
    args = ["--tls-cert", str(cert), "--tls-key", str(key)]
    first = start_server(args=args)
    made = re.search(r"made a TLS key pair for this server: .* \(fingerprint (sha256:\w+)\)",
                     first.log())
    assert made, first.log_tail()
    fingerprint = made.group(1)
    assert f"rgpu server certificate {fingerprint}" in first.log()
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(key.parent).st_mode) == 0o700
    first.stop()
    second = start_server(args=args)
    assert "made a TLS key pair" not in second.log(), second.log_tail()
    assert f"rgpu server certificate {fingerprint}" in second.log()
    r = h.run([h.RGPU, "server", *args, "--print-fingerprint"], env=h.base_env(), timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == fingerprint, r.describe()
    r = devices(second, RGPU_TLS="on", RGPU_TLS_FINGERPRINT=fingerprint)
    assert r.returncode == 0, r.describe()
    # A certificate without its key is an error, not replaced.
    second.stop()
    key.unlink()
    r = h.run([h.RGPU, "server", *args, "--print-fingerprint"], env=h.base_env(), timeout=60)
    assert r.returncode != 0 and "has no key" in r.stderr, r.describe()
