"""clinfo through rgpu: the `rgpu` platform appears beside the native one, with the server's
devices under their own names; with two servers, both devices appear."""

import re
import shutil

import pytest

import rgpu_harness as h

pytestmark = pytest.mark.skipif(shutil.which("clinfo") is None, reason="clinfo not installed")


def rgpu_platform(plats: dict[str, list[str]]) -> list[str]:
    assert "rgpu" in plats, f"no platform named rgpu: {plats}"
    return plats["rgpu"]


def test_clinfo_lists_rgpu_platform(server):
    native = h.native_device_names()
    r = h.run(h.rgpu_run_cmd([server], ["clinfo"]), h.base_env(), timeout=120)
    assert r.returncode == 0, r.describe() + server.log_tail()
    # The full listing: an rgpu platform section with the native device's name.
    names = re.findall(r"^\s*Platform Name\s+(.+?)\s*$", r.stdout, re.M)
    assert "rgpu" in names, f"platform names {names}\n{r.describe()}"
    assert any(n != "rgpu" for n in names), f"the native platform is gone: {names}"
    devices = re.findall(r"^\s*Device Name\s+(.+?)\s*$", r.stdout, re.M)
    for d in native:
        # once natively, once through rgpu
        assert devices.count(d) >= 2, f"device {d!r} not listed under rgpu: {devices}"
    # clinfo's "NULL platform behavior" section and the rest ran without a crash.
    assert "ICD loader" in r.stdout
    assert server.alive(), server.log_tail()


def test_clinfo_list_one_server(server):
    native = h.native_device_names()
    r = h.run(h.rgpu_run_cmd([server], ["clinfo", "-l"]), h.base_env(), timeout=120)
    assert r.returncode == 0, r.describe() + server.log_tail()
    plats = h.parse_clinfo_l(r.stdout)
    assert rgpu_platform(plats) == native, r.stdout
    # The native platform is still there, unchanged.
    assert any(h.NATIVE_PLATFORM in p and d == native for p, d in plats.items()), r.stdout


def test_clinfo_two_servers(start_server):
    native = h.native_device_names()
    a, b = start_server(), start_server()
    r = h.run(h.rgpu_run_cmd([a, b], ["clinfo", "-l"]), h.base_env(), timeout=120)
    assert r.returncode == 0, r.describe() + a.log_tail() + b.log_tail()
    devs = rgpu_platform(h.parse_clinfo_l(r.stdout))
    assert len(devs) == 2 * len(native), f"rgpu devices {devs}, native {native}\n{r.stdout}"
    assert sorted(devs) == sorted(native * 2), devs
    # Also in the full listing.
    r = h.run(h.rgpu_run_cmd([a, b], ["clinfo"]), h.base_env(), timeout=180)
    assert r.returncode == 0, r.describe()
    m = re.search(r"Platform Name\s+rgpu\s*\nNumber of devices\s+(\d+)", r.stdout)
    assert m and int(m.group(1)) == 2 * len(native), r.stdout[:3000]


def test_rgpu_devices_command(start_server):
    """`rgpu devices` lists each device with the server that holds it."""
    native = h.native_device_names()
    a, b = start_server(), start_server()
    r = h.run([str(h.RGPU), "devices"], h.base_env(RGPU_SERVERS=f"{a.endpoint},{b.endpoint}"),
              timeout=60)
    assert r.returncode == 0, r.describe()
    for s in (a, b):
        assert s.endpoint in r.stdout, f"{s.endpoint} not in:\n{r.stdout}"
    for d in native:
        assert r.stdout.count(d) >= 2, f"{d!r} not listed twice:\n{r.stdout}"
