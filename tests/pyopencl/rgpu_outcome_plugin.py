"""pytest plugin used by run_suite.py (loaded with ``-p rgpu_outcome_plugin``).

* Appends one JSON line per test to $RGPU_OUTCOMES as soon as the test is finished, and a
  "start" line before it runs, so the outcomes survive a crash of the whole process (a segfault
  in a driver, or pytest-timeout's thread method ending a hung test with os._exit): the test
  that started and never finished is the one that crashed.
* Deselects the node ids listed in $RGPU_DESELECT (one per line), so that run_suite.py can
  resume a run after such a crash without running the finished tests again.
"""

import json
import os
import time

_OUT = os.environ.get("RGPU_OUTCOMES")
_DESELECT = os.environ.get("RGPU_DESELECT")
_reports = {}


def _write(rec):
    if not _OUT:
        return
    with open(_OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def pytest_collection_modifyitems(config, items):
    if not _DESELECT or not os.path.exists(_DESELECT):
        return
    with open(_DESELECT, encoding="utf-8") as f:
        done = {line.rstrip("\n") for line in f if line.strip()}
    keep, drop = [], []
    for item in items:
        (drop if item.nodeid in done else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collectreport(report):
    if report.failed:
        _write({"event": "collect_error", "nodeid": report.nodeid,
                "message": _message(report)})


def pytest_runtest_logstart(nodeid, location):
    _reports[nodeid] = []
    _write({"event": "start", "nodeid": nodeid, "t": time.time()})


def pytest_runtest_logreport(report):
    _reports.setdefault(report.nodeid, []).append(report)


def _message(report):
    try:
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            msg = crash.message
        elif isinstance(report.longrepr, tuple):  # skip: (file, line, reason)
            msg = str(report.longrepr[2])
        else:
            msg = str(report.longrepr or "")
    except Exception as exc:  # never let the plugin break the run
        msg = f"<no message: {exc!r}>"
    msg = " ".join(msg.split())
    return msg[:300]


def outcome_of(reports):
    """Final outcome of one test from its setup/call/teardown reports."""
    outcome, message = "passed", ""
    for r in reports:
        xfail = hasattr(r, "wasxfail")
        if r.when == "setup":
            if r.failed:
                return "error", _message(r)
            if r.skipped:
                return ("xfailed" if xfail else "skipped"), (r.wasxfail if xfail else _message(r))
        elif r.when == "call":
            if r.failed:
                outcome, message = "failed", _message(r)
            elif r.skipped:
                outcome = "xfailed" if xfail else "skipped"
                message = r.wasxfail if xfail else _message(r)
            elif xfail:
                outcome = "xpassed"
        elif r.when == "teardown" and r.failed and outcome in ("passed", "xpassed"):
            outcome, message = "error", "teardown: " + _message(r)
    return outcome, message


def pytest_runtest_logfinish(nodeid, location):
    reports = _reports.pop(nodeid, [])
    outcome, message = outcome_of(reports)
    duration = sum(getattr(r, "duration", 0.0) for r in reports)
    _write({"event": "end", "nodeid": nodeid, "outcome": outcome,
            "duration": round(duration, 3), "message": message})
