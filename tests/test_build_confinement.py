"""A build reads the program's sources and the headers its client sent, never the server's
files: through `rgpu run` against a real server on PoCL, a program that includes a file by a
computed name or a path climbing out with `..` fails to build with the reason in its log and
none of the file's contents; a relative include finds nothing in the worker's directory (its
own, empty); build options that make the compiler read other files are refused with
CL_INVALID_BUILD_OPTIONS; a program with its own headers builds, sent from a -I directory or
included by their absolute path on the client (the client sends them, and the program's
source reads back as written)."""

import subprocess
import sys
import textwrap

import rgpu_harness as h

PROGRAM = textwrap.dedent(r"""
    import sys
    import pyopencl as cl

    secret, own_dir = sys.argv[1], sys.argv[2]
    platform = [p for p in cl.get_platforms() if p.name == "rgpu"][0]
    ctx = cl.Context(platform.get_devices())

    def build(source, options=()):
        try:
            cl.Program(ctx, source).build(options=list(options), cache_dir=False)
            return "built"
        except cl.Error as e:
            return str(e)

    outcome = build(f'#define F "{secret}"\n#include F\nkernel void k() {{}}')
    assert "computed name" in outcome and "is refused" in outcome, outcome
    assert "SECRET_WORD" not in outcome, "the server's file reached the build log"
    outcome = build('#include "../../../../../../etc/passwd"\nkernel void k() {}')
    assert "is refused" in outcome and "root:" not in outcome, outcome
    outcome = build('#include "etc/passwd"\nkernel void k() {}')
    assert outcome != "built" and "root:" not in outcome, outcome
    source = f'#include "{own_dir}/own.h"\nkernel void k(global int *x) {{ x[0] = OWN; }}'
    program = cl.Program(ctx, source)
    program.build(cache_dir=False)
    assert program.get_info(cl.program_info.SOURCE) == source
    outcome = build("kernel void k() {}", ["-include", secret])
    assert "INVALID_BUILD_OPTIONS" in outcome, outcome
    assert build('#include "own.h"\nkernel void k(global int *x) { x[0] = OWN; }',
                 ["-I", own_dir]) == "built"
    print("PASS")
""")


def test_a_build_reads_no_file_of_the_servers(server, tmp_path):
    secret = tmp_path / "secret.h"
    secret.write_text("SECRET_WORD is not OpenCL C\n")
    own = tmp_path / "own"
    own.mkdir()
    (own / "own.h").write_text("#define OWN 7\n")
    cmd = h.rgpu_run_cmd([server.endpoint], [sys.executable, "-c", PROGRAM, str(secret), str(own)])
    result = subprocess.run(cmd, env=h.base_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "PASS" in result.stdout, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    )
