"""Tests of run_suite.py's own logic (no OpenCL needed): id normalisation, junit/jsonl parsing,
the native-vs-rgpu comparison with known failures, the results document, and resuming a pytest
run whose process died in a test."""

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_suite as rs  # noqa: E402

CTX_POCL = ("<context factory for <pyopencl.Device 'pthread-skylake-avx512' on "
            "'Portable Computing Language'>>")
CTX_RGPU = "<context factory for <pyopencl.Device 'pthread-skylake-avx512' on 'rgpu'>>"


def junit(path: Path, cases: list[tuple[str, str, str]]) -> Path:
    """cases: (classname, name, outcome) with outcome pass|fail|error|skip|xfail."""
    body = []
    for classname, name, outcome in cases:
        inner = {
            "pass": "",
            "fail": '<failure message="assert 1 == 2">trace</failure>',
            "error": '<error message="failed on setup">trace</error>',
            "skip": '<skipped type="pytest.skip" message="no images">x</skipped>',
            "xfail": '<skipped type="pytest.xfail" message="known">x</skipped>',
        }[outcome]
        name = name.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        body.append(f'<testcase classname="{classname}" name="{name}" time="0.1">{inner}'
                    "</testcase>")
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
                    + "".join(body) + "</testsuite></testsuites>")
    return path


def test_normalize_id_strips_platform_and_device():
    a = rs.normalize_id(f"test_array.py::test_sum[{CTX_POCL}-float32]")
    b = rs.normalize_id(f"test_array.py::test_sum[{CTX_RGPU}-float32]")
    assert a == b == "test_array.py::test_sum[<ctx>-float32]"
    d = rs.normalize_id("test_wrapper.py::test_x[<pyopencl.Device 'cpu' on 'rgpu' at 0x55d0>]")
    assert d == "test_wrapper.py::test_x[<device>]"
    p = rs.normalize_id("test_wrapper.py::test_p[<pyopencl.Platform 'rgpu' at 0x1234>]")
    assert p == "test_wrapper.py::test_p[<platform>]"


def test_read_junit_outcomes(tmp_path):
    x = junit(tmp_path / "a.xml", [
        ("test_array", f"test_a[{CTX_POCL}]", "pass"),
        ("test_array", f"test_b[{CTX_POCL}]", "fail"),
        ("test_array", f"test_c[{CTX_POCL}]", "error"),
        ("test_array", f"test_d[{CTX_POCL}]", "skip"),
        ("test_array", f"test_e[{CTX_POCL}]", "xfail"),
        ("test_array.TestK", "test_f", "pass"),
    ])
    t = rs.read_junit(x)
    assert {k: v.outcome for k, v in t.items()} == {
        "test_array.py::test_a[<ctx>]": "passed",
        "test_array.py::test_b[<ctx>]": "failed",
        "test_array.py::test_c[<ctx>]": "error",
        "test_array.py::test_d[<ctx>]": "skipped",
        "test_array.py::test_e[<ctx>]": "xfailed",
        "test_array.py::TestK::test_f": "passed",
    }
    assert t["test_array.py::test_b[<ctx>]"].message == "assert 1 == 2"


def test_compare_with_known_failures(tmp_path):
    native = rs.read_junit(junit(tmp_path / "n.xml", [
        ("test_w", f"test_ok[{CTX_POCL}]", "pass"),
        ("test_w", f"test_reg[{CTX_POCL}]", "pass"),
        ("test_w", f"test_listed[{CTX_POCL}-1]", "pass"),
        ("test_w", f"test_listed[{CTX_POCL}-2]", "pass"),
        ("test_w", f"test_stale[{CTX_POCL}]", "pass"),
        ("test_w", f"test_natfail[{CTX_POCL}]", "fail"),
        ("test_w", f"test_better[{CTX_POCL}]", "fail"),
        ("test_w", f"test_missing[{CTX_POCL}]", "pass"),
    ]))
    rgpu = rs.read_junit(junit(tmp_path / "r.xml", [
        ("test_w", f"test_ok[{CTX_RGPU}]", "pass"),
        ("test_w", f"test_reg[{CTX_RGPU}]", "fail"),
        ("test_w", f"test_listed[{CTX_RGPU}-1]", "error"),
        ("test_w", f"test_listed[{CTX_RGPU}-2]", "skip"),
        ("test_w", f"test_stale[{CTX_RGPU}]", "pass"),
        ("test_w", f"test_natfail[{CTX_RGPU}]", "fail"),
        ("test_w", f"test_better[{CTX_RGPU}]", "pass"),
    ]))
    kf = tmp_path / "known.txt"
    kf.write_text(textwrap.dedent("""\
        # comment line
        test_w.py::test_listed   # all parametrizations: images not supported yet
        test_w.py::test_stale[<ctx>]  # was broken
        """))
    known = rs.read_known_failures(kf)
    assert known["test_w.py::test_listed"] == "all parametrizations: images not supported yet"
    c = rs.compare(native, rgpu, known)
    assert [t for t, _ in c.regressions] == ["test_w.py::test_missing[<ctx>]",
                                             "test_w.py::test_reg[<ctx>]"]
    assert dict((t, o.outcome) for t, o in c.regressions)["test_w.py::test_missing[<ctx>]"] \
        == "notrun"
    assert sorted(t for t, _, _ in c.known) == ["test_w.py::test_listed[<ctx>-1]",
                                                "test_w.py::test_listed[<ctx>-2]"]
    assert c.fixed_known == ["test_w.py::test_stale[<ctx>]"]
    assert c.rgpu_only_pass == ["test_w.py::test_better[<ctx>]"]
    # The --compare entry point exits 1 on an unlisted regression, 0 without one.
    assert rs.main(["--known", str(kf), "--compare", str(tmp_path / "n.xml"),
                    str(tmp_path / "r.xml")]) == 1
    assert rs.main(["--known", str(kf), "--compare", str(tmp_path / "n.xml"),
                    str(tmp_path / "n.xml")]) == 0


def test_results_document_keeps_hand_written_text(tmp_path):
    doc = tmp_path / "res.md"
    doc.write_text(f"# Title\n\nintro\n\n{rs.BEGIN}\nold\n{rs.END}\n\n## Notes\n\nkept\n")
    run_n = rs.FileRun("native", "test_w.py", {"test_w.py::a": rs.Outcome("passed"),
                                               "test_w.py::b": rs.Outcome("failed", "boom")})
    run_r = rs.FileRun("rgpu", "test_w.py", {"test_w.py::a": rs.Outcome("crashed", "x")})
    comps = {"test_w.py": rs.compare(run_n.tests, run_r.tests, {})}
    block = rs.render({("native", "test_w.py"): run_n, ("rgpu", "test_w.py"): run_r},
                      ["test_w.py"], comps, {}, "2026.1.4", "cpu", "cmd")
    rs.write_results(doc, block)
    text = doc.read_text()
    assert text.startswith("# Title\n\nintro\n\n" + rs.BEGIN)
    assert "old" not in text and text.rstrip().endswith("## Notes\n\nkept")
    assert "| `test_w.py` | 1 | 1 | 0 | 0 | 0 | 0 | 1 | 0 |" in text
    assert "- `test_w.py::a`: crashed" in text


@pytest.mark.skipif(importlib.util.find_spec("pytest_timeout") is None,
                    reason="pytest-timeout not installed (scripts/setup.sh installs it)")
def test_run_resumes_after_crash_and_hang(tmp_path):
    testdir = tmp_path / "t"
    testdir.mkdir()
    (testdir / "pytest.ini").write_text("[pytest]\n")
    (testdir / "test_fake.py").write_text(textwrap.dedent("""\
        import os, time, pytest
        def test_1_pass(): pass
        def test_2_crash(): os._exit(139)
        def test_3_fail(): assert 1 == 2
        def test_4_hang(): time.sleep(60)
        @pytest.mark.skip(reason="nope")
        def test_5_skip(): pass
        @pytest.mark.xfail(reason="known")
        def test_6_xfail(): assert 0
        @pytest.fixture
        def broken(): raise RuntimeError("setup broke")
        def test_7_error(broken): pass
        def test_8_pass(): pass
        """))
    out = tmp_path / "out"
    out.mkdir()
    r = rs.run_file("native", "test_fake.py", testdir, out, None, per_test_timeout=2,
                    run_timeout=120, max_restarts=5, extra=[])
    got = {k.split("::")[1]: v.outcome for k, v in r.tests.items()}
    assert got == {"test_1_pass": "passed", "test_2_crash": "crashed", "test_3_fail": "failed",
                   "test_4_hang": "crashed", "test_5_skip": "skipped",
                   "test_6_xfail": "xfailed", "test_7_error": "error", "test_8_pass": "passed"}
    assert r.attempts == 3
    assert r.counts() == {"passed": 2, "failed": 1, "error": 3, "skipped": 2, "not run": 0}
