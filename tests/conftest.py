"""Fixtures shared by the test files: the website, built once per run. The set-up every test
and notebook gets (8 simulated devices, the compilation cache, the order of the files) is
in the repository's conftest.py."""

import os

import pytest


# The website, built once per test run and shared by the tests that read it (test_site.py,
# test_browser.py): under xdist the workers share pytest's base temporary folder, and a file
# lock makes the first worker that asks build it while the others wait for it.
@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    import fcntl
    import json
    import subprocess
    import sys
    from pathlib import Path

    if os.environ.get("SCALEBOOK_BUILT_SITE"):   # authoring only: reuse a site built before
        out = Path(os.environ["SCALEBOOK_BUILT_SITE"])
        return out / "_build" / "html", {"returncode": 0, "stdout": "", "stderr": ""}
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out, result = base / "site", base / "site-build.json"
    with open(base / "site-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            root = Path(__file__).resolve().parents[1]
            jb = Path(sys.executable).with_name("jupyter-book")
            r = subprocess.run([str(jb), "build", str(root), "--path-output", str(out), "-W",
                                "-n", "--keep-going"], capture_output=True, text=True,
                               timeout=900)
            result.write_text(json.dumps({"returncode": r.returncode, "stdout": r.stdout[-3000:],
                                          "stderr": r.stderr[-3000:]}))
    return out / "_build" / "html", json.loads(result.read_text())


# The slip battery's table (tests/exercise_harness.py, issue 25), printed after the run:
# the all-chapter one when tests/test_slip_battery.py ran, else the chapters whose tests
# ran; then the chapters' known pitfalls (their test files' typical mistakes).
def pytest_terminal_summary(terminalreporter):
    stats = terminalreporter.stats
    reports = [r for key in ("passed", "failed") for r in stats.get(key, [])
               if getattr(r, "when", None) == "call"]
    props = [(k, v) for r in reports for k, v in getattr(r, "user_properties", [])]
    report = next((v for k, v in props if k == "slip_battery_report"), None)
    records = [v for k, v in props if k == "slip_battery"]
    if report is None and not records:
        return
    from exercise_harness import pitfall_line, summary_from_records
    if report is None:
        report = ("Slip battery (issue 25): share of rejected slips whose message "
                  "names the slip\n" + summary_from_records(records))
    terminalreporter.section("slip battery")
    terminalreporter.write_line(report)
    if records:
        terminalreporter.write_line(pitfall_line(records))
