"""Helpers for the rgpu integration tests: locating the built binaries, starting and stopping
real `rgpu server` processes, building the C test programs and running programs natively
(PoCL) or through rgpu, always with timeouts.

Environment knobs:
  RGPU_BUILD_DIR         where `rgpu` and `librgpu_opencl.so` are (default <repo>/target/release)
  RGPU_TEST_TIMEOUT      seconds allowed to one test program (default 120)
  RGPU_TEST_NATIVE       substring of the native platform's name (default "Portable")
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
C_DIR = TESTS / "opencl"
WORK = TESTS / "work"
BUILD_DIR = Path(os.environ.get("RGPU_BUILD_DIR") or REPO / "target" / "release")
RGPU = BUILD_DIR / "rgpu"
ICD = BUILD_DIR / "librgpu_opencl.so"
PROGRAM_TIMEOUT = float(os.environ.get("RGPU_TEST_TIMEOUT", "120"))
NATIVE_PLATFORM = os.environ.get("RGPU_TEST_NATIVE", "Portable")
LISTEN_RE = re.compile(r"rgpu server listening on (\S+)")

# Variables that would change what a test program or server sees; cleared unless a test sets
# them.
_AMBIENT_VARS = ("RGPU_SERVERS", "RGPU_TOKEN", "RGPU_TOKEN_FILE", "RGPU_TEST_PLATFORM",
                 "RGPU_TEST_EXPECT_SERVER", "RGPU_TEST_NATIVE_COMPARE", "RGPU_LISTEN",
                 "RGPU_SERVER_CONFIG", "RGPU_SERVER_TOKEN_FILE", "RGPU_SERVER_NAME",
                 "RGPU_SERVER_NO_CUDA", "RGPU_TLS", "RGPU_TLS_FINGERPRINT", "RGPU_TLS_CA",
                 "RGPU_SERVER_TLS_CERT", "RGPU_SERVER_TLS_KEY", "RGPU_SERVER_PLAINTEXT")

GROUPS = ["platform_device", "context_queue", "buffers", "images_samplers", "programs",
          "kernels", "events", "compute"]


def missing_binaries() -> str | None:
    """None when the rgpu binaries exist, else a message saying what is missing."""
    missing = [str(p) for p in (RGPU, ICD) if not p.is_file()]
    if not missing:
        return None
    return ("rgpu binaries not built: missing " + ", ".join(missing) +
            " (run `cargo build --release`, or set RGPU_BUILD_DIR)")


# The test servers' TLS identity: made once, in the work directory (not the user's state
# directory); every client the tests start pins it.
TLS_CERT = WORK / "tls" / "server.crt"
TLS_KEY = WORK / "tls" / "server.key"
_fingerprint: str | None = None


def tls_fingerprint() -> str:
    """The test servers' certificate fingerprint (the identity is made on first use)."""
    global _fingerprint
    if _fingerprint is None:
        env = {k: v for k, v in os.environ.items() if k not in _AMBIENT_VARS}
        env.update(RGPU_SERVER_TLS_CERT=str(TLS_CERT), RGPU_SERVER_TLS_KEY=str(TLS_KEY))
        r = subprocess.run([str(RGPU), "server", "--print-fingerprint"], env=env,
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0 or not r.stdout.startswith("sha256:"):
            raise RuntimeError(f"rgpu server --print-fingerprint failed: {r.stderr}")
        _fingerprint = r.stdout.strip()
    return _fingerprint


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _AMBIENT_VARS}
    # A TCP server on this host would move a client to its same-host socket (shared memory):
    # the suite's TCP servers are there to exercise TCP. Tests of the move turn it back on.
    env["RGPU_SAME_HOST"] = "off"
    if RGPU.is_file():
        env.update(RGPU_SERVER_TLS_CERT=str(TLS_CERT), RGPU_SERVER_TLS_KEY=str(TLS_KEY),
                   RGPU_TLS_FINGERPRINT=tls_fingerprint())
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    return env


# ---------------------------------------------------------------- running with timeouts

@dataclass
class Result:
    cmd: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    def describe(self, limit: int = 6000) -> str:
        out = self.stdout[-limit:]
        err = self.stderr[-limit:]
        state = "TIMED OUT" if self.timed_out else f"exit {self.returncode}"
        return (f"$ {' '.join(self.cmd)}\n[{state} after {self.seconds:.1f}s]\n"
                f"--- stdout ---\n{out}\n--- stderr ---\n{err}")


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = PROGRAM_TIMEOUT,
        cwd: Path | None = None, input: str | None = None) -> Result:
    """Runs cmd in its own process group; on timeout the whole group is killed."""
    t0 = time.monotonic()
    proc = subprocess.Popen([str(c) for c in cmd], env=env if env is not None else base_env(),
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        timed_out = True
    finally:
        # Whatever the program left behind in its group goes too.
        _kill_group(proc)
    return Result([str(c) for c in cmd], None if timed_out else proc.returncode, out, err,
                  time.monotonic() - t0, timed_out)


# ---------------------------------------------------------------- servers

_server_seq = 0
_server_lock = threading.Lock()


class Server:
    """One `rgpu server` process on a free loopback port (or a Unix socket; or where its config
    file says, with listen=None)."""

    def __init__(self, token_file: Path | str | None = None, unix: bool = False,
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 verbose: bool = False, listen: str | None = "127.0.0.1:0",
                 program: Path | None = None):
        global _server_seq
        with _server_lock:
            _server_seq += 1
            seq = _server_seq
        (WORK / "logs").mkdir(parents=True, exist_ok=True)
        self.log_path = WORK / "logs" / f"server-{os.getpid()}-{seq}.log"
        self._tmpdir = None
        if unix:
            self._tmpdir = tempfile.mkdtemp(prefix="rgpu-test-")
            listen = f"unix:{self._tmpdir}/server.sock"
        cmd = [str(program or RGPU)] + (["-v"] if verbose else []) + ["server"]
        if listen is not None:
            cmd += ["--listen", listen]
        if token_file is not None:
            cmd += ["--token-file", str(token_file)]
        cmd += list(args)
        self.cmd = cmd
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env or base_env(), stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.endpoint = self._wait_listening(30.0)

    def _wait_listening(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = LISTEN_RE.search(self.log())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"rgpu server did not report its endpoint within {timeout}s "
                           f"(exit {self.proc.returncode}):\n{self.log()[-4000:]}")

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_log(self, pattern: str, count: int = 1, timeout: float = 10.0) -> int:
        """Waits until the log has `count` matches of the regex `pattern` (lines that other
        processes of the server, such as session workers, may write just after the client saw
        the event); returns how many it has then."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = len(regex.findall(self.log()))
            if found >= count or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)

    def log_tail(self, n: int = 4000) -> str:
        return f"--- server log {self.log_path} ---\n{self.log()[-n:]}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kb(self) -> int:
        """Resident memory of the server and its session workers together."""
        total = _rss_kb(self.pid)
        if total is None:
            raise RuntimeError("no VmRSS")
        return total + sum(_rss_kb(pid) or 0 for pid in self.worker_pids())

    def worker_pids(self) -> list[int]:
        """The server's child processes (its session workers, started ahead or serving)."""
        children = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # The command name may hold spaces and parentheses: the fields follow the last ")".
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == self.pid:
                children.append(int(entry))
        return children

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Stops the server with sig; SIGKILL if it has not exited after timeout. Returns the
        exit code it had for sig (None if it had to be killed)."""
        code = None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                code = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(self.proc)
                self.proc.wait()
                code = None
        else:
            code = self.proc.returncode
        _kill_group(self.proc)
        if not self._log.closed:
            self._log.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        return code


def _rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def read_trace(path: Path) -> tuple[dict, list[dict], list[dict]]:
    """An `RGPU_TRACE` file: its header, its call records, and the servers' counters of the
    program's sessions (the lines with `counters`)."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
    rest = lines[1:]
    return (lines[0], [r for r in rest if "counters" not in r],
            [r for r in rest if "counters" in r])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- C programs

_build_lock = threading.Lock()
CFLAGS = ["-O1", "-g", "-Wall", "-Wextra", "-Wno-unused-function",
          "-DCL_TARGET_OPENCL_VERSION=300"]


def build_c(name: str) -> Path:
    """Compiles tests/opencl/<name>.c into tests/work/<name> (when out of date)."""
    src = C_DIR / f"{name}.c"
    out = WORK / name
    deps = [src, C_DIR / "common.h"]
    with _build_lock:
        WORK.mkdir(parents=True, exist_ok=True)
        if out.exists() and all(out.stat().st_mtime >= d.stat().st_mtime for d in deps):
            return out
        tmp = WORK / f".{name}.{os.getpid()}.tmp"
        cmd = ["gcc", *CFLAGS, "-o", str(tmp), str(src), "-lOpenCL", "-lpthread"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"cannot build {src}:\n{' '.join(cmd)}\n{r.stderr}")
        tmp.replace(out)
    return out


def run_native(prog: Path | list, args: list[str] = (), timeout: float = PROGRAM_TIMEOUT,
               **env: str) -> Result:
    cmd = [str(prog)] if isinstance(prog, (str, Path)) else [str(p) for p in prog]
    return run(cmd + list(args), base_env(RGPU_TEST_PLATFORM=NATIVE_PLATFORM, **env),
               timeout=timeout)


def rgpu_run_cmd(servers: list, cmd: list, token_file: Path | str | None = None) -> list[str]:
    eps = ",".join(s.endpoint if isinstance(s, Server) else str(s) for s in servers)
    full = [str(RGPU), "run", "--servers", eps]
    if token_file is not None:
        full += ["--token-file", str(token_file)]
    return full + ["--"] + [str(c) for c in cmd]


def run_rgpu(prog: Path | list, servers: list, args: list[str] = (),
             token_file: Path | str | None = None, timeout: float = PROGRAM_TIMEOUT,
             **env: str) -> Result:
    """Runs a program through `rgpu run` against servers; the test programs select the rgpu
    platform and compare what they see with the native twin of each remote device."""
    cmd = [str(prog)] if isinstance(prog, (str, Path)) else [str(p) for p in prog]
    eps = ",".join(s.endpoint if isinstance(s, Server) else str(s) for s in servers)
    e = dict(RGPU_TEST_PLATFORM="rgpu", RGPU_TEST_EXPECT_SERVER=eps,
             RGPU_TEST_NATIVE_COMPARE=NATIVE_PLATFORM)
    e.update(env)
    return run(rgpu_run_cmd(servers, cmd + list(args), token_file), base_env(**e),
               timeout=timeout)


def hold_session(isolation: Path, server: Server, **env: str) -> subprocess.Popen:
    """A client (tests/opencl/isolation.c) that keeps its session open until it gets a line
    on stdin; returned once it says READY (or has ended)."""
    proc = subprocess.Popen(
        rgpu_run_cmd([server], [isolation, "secret", "held"]),
        env=base_env(RGPU_TEST_PLATFORM="rgpu", **env), text=True, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or line.strip() == "READY":
            break
    return proc


def assert_pass(r: Result, group: str, server: Server | None = None) -> None:
    ok = (not r.timed_out and r.returncode == 0 and
          re.search(rf"^PASS {re.escape(group)}\b", r.stdout, re.M) is not None)
    if not ok:
        why = first_failure(r) or ("timed out" if r.timed_out else f"exit {r.returncode}")
        msg = f"{group} did not pass: {why}\n{r.describe()}"
        if server is not None:
            msg += "\n" + server.log_tail()
        raise AssertionError(msg)


def first_failure(r: Result) -> str:
    """The FAIL line a test program printed, for short messages."""
    for line in (r.stderr + "\n" + r.stdout).splitlines():
        if line.startswith("FAIL"):
            return line
    return ""


# ---------------------------------------------------------------- clinfo

def parse_clinfo_l(text: str) -> dict[str, list[str]]:
    """`clinfo -l` output -> {platform name: [device names]}."""
    platforms: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"\s*Platform #\d+: (.*)$", line)
        if m:
            current = m.group(1).strip()
            platforms.setdefault(current, [])
            continue
        m = re.match(r"\s*[`|+\\]-- Device #\d+: (.*)$", line)
        if m and current is not None:
            platforms[current].append(m.group(1).strip())
    return platforms


def native_device_names() -> list[str]:
    r = run(["clinfo", "-l"], base_env(), timeout=60)
    assert r.returncode == 0, r.describe()
    plats = parse_clinfo_l(r.stdout)
    for name, devs in plats.items():
        if NATIVE_PLATFORM in name:
            return devs
    raise AssertionError(f"no native platform '{NATIVE_PLATFORM}' in clinfo -l:\n{r.stdout}")
