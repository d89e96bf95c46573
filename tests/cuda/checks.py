"""What the Python checks in tests/cuda share (the counterpart of check.h): `CHECK` lines for
compare.py, the failure a check raises, and the PASS/FAIL/exit-status protocol gpu-check.sh
reads."""
import sys
import traceback


class CheckFailed(Exception):
    pass


def check(name, *values):
    """Prints a `CHECK` line: values compared between the native run and the rgpu run."""
    print(f"CHECK {name} " + " ".join(f"{float(v):.6e}" for v in values), flush=True)


def run(label, main):
    """Runs `main`, then prints `PASS <label>` and exits 0, or `FAIL <label>: why` and exits 1."""
    try:
        main()
    except CheckFailed as e:
        print(f"FAIL {label}: {e}")
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 - any CUDA error is a failure of the check
        traceback.print_exc()
        print(f"FAIL {label}: {type(e).__name__}: {e}")
        sys.exit(1)
    print(f"PASS {label}")
    sys.exit(0)
