"""What an operator deploys: `rgpu token new`, the server's TOML config file with its precedence
(flags > environment > file > defaults) and `--print-config`, and the warning about a token file
others can read. Real servers on PoCL, real clients over TCP."""

import os
import stat
import subprocess

import rgpu_harness as h


def rgpu(*args, env=None, timeout=30):
    return subprocess.run([str(h.RGPU), *args], capture_output=True, text=True,
                          env=env or h.base_env(), timeout=timeout)


def test_token_new_is_private_and_never_overwritten(rgpu_bins, tmp_path):
    token = tmp_path / "token"
    r = rgpu("token", "new", str(token))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    first = token.read_text().strip()
    assert len(first) == 64 and all(c in "0123456789abcdef" for c in first)
    r = rgpu("token", "new", str(token))
    assert r.returncode != 0 and "exists" in r.stderr
    assert token.read_text().strip() == first
    r = rgpu("token", "new", "--force", str(token))
    assert r.returncode == 0, r.stderr
    assert token.read_text().strip() != first
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["token"]


def test_config_file_serves_with_its_token(start_server, c_program, tmp_path):
    token = tmp_path / "token"
    assert rgpu("token", "new", str(token)).returncode == 0
    config = tmp_path / "server.toml"
    config.write_text(f'listen = "127.0.0.1:0"\ntoken_file = "{token}"\nname = "from-file"\n')
    server = start_server(listen=None, args=["--config", str(config)])
    assert "clients must present the token" in server.log(), server.log_tail()
    assert "mode" not in server.log(), server.log_tail()
    pd = c_program("platform_device")
    h.assert_pass(h.run_rgpu(pd, [server], token_file=token), "platform_device", server)
    # Without the token the same client sees no rgpu device.
    r = h.run_rgpu(pd, [server], timeout=60)
    assert not r.timed_out and r.returncode != 0, r.describe()
    assert server.alive()


def test_precedence_and_print_config(rgpu_bins, tmp_path):
    config = tmp_path / "server.toml"
    config.write_text('listen = "0.0.0.0:7999"\nname = "file"\nplatform = "file"\n'
                      'no_cuda = true\n')
    env = h.base_env(RGPU_SERVER_NAME="env", RGPU_SERVER_PLATFORM="env")
    r = rgpu("server", "--config", str(config), "--platform", "flag", "--print-config", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert 'platform = "flag"  # command line' in lines, r.stdout
    assert 'name = "env"  # environment: RGPU_SERVER_NAME' in lines, r.stdout
    assert f'listen = "0.0.0.0:7999"  # config file: {config}' in lines, r.stdout
    assert f"no_cuda = true  # config file: {config}" in lines, r.stdout
    assert "# token_file =  (not set)" in lines, r.stdout
    # The config file itself may come from the environment.
    env = h.base_env(RGPU_SERVER_CONFIG=str(config))
    r = rgpu("server", "--print-config", env=env)
    assert f'name = "file"  # config file: {config}' in r.stdout.splitlines(), r.stdout


def test_bad_config_files_are_refused_plainly(rgpu_bins, tmp_path):
    config = tmp_path / "server.toml"
    for text, expected in [('lisen = "127.0.0.1:0"\n', "unknown setting `lisen`"),
                           ("no_cuda = 1\n", "no_cuda"),
                           ("listen = [\n", str(config))]:
        config.write_text(text)
        r = rgpu("server", "--config", str(config), "--print-config")
        assert r.returncode != 0, (text, r.stdout)
        assert expected in r.stderr, (text, r.stderr)
    r = rgpu("server", "--config", str(tmp_path / "missing.toml"))
    assert r.returncode != 0 and "cannot read config file" in r.stderr, r.stderr


def test_server_warns_about_a_token_file_others_can_read(start_server, tmp_path):
    token = tmp_path / "token"
    token.write_text("a-token-of-at-least-16-characters\n")
    token.chmod(0o644)
    server = start_server(token_file=token)
    assert "every user of this machine can read the token" in server.log(), server.log_tail()
