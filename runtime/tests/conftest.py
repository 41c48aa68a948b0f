import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIME = os.path.dirname(HERE)
REPO = os.path.dirname(RUNTIME)
SRC = os.path.join(RUNTIME, "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

SGLANG_PY = os.environ.get("SGLANG_VENV_PYTHON", os.path.join(REPO, ".venv-sglang", "bin", "python"))

# the tensor tests run on the CPU with the pure torch path
os.environ.setdefault("SGLANG_DDTREE_DISABLE_TRITON", "1")

if os.environ.get("TRITON_INTERPRET") == "1":  # a test run under Triton's CPU interpreter
    import interp_fast

    interp_fast.install()


def pytest_configure(config):
    config.addinivalue_line("markers", "sglang: needs .venv-sglang (real sglang 0.5.23)")
    config.addinivalue_line("markers", "subprocess_job(key): the test checks the result of the registered "
                                       "subprocess job `key` (started in the background at collection)")


@pytest.fixture
def sglang_python():
    if not os.path.exists(SGLANG_PY):
        pytest.skip(f"{SGLANG_PY} is absent: run scripts/sglang-venv first (CI does)")
    return SGLANG_PY


# ---------------------------------------------------------------------------
# Background subprocess jobs.
#
# The Triton-interpreter checks are single-threaded subprocesses of a minute or
# so each.  A test module registers each such subprocess with
# ``subprocess_job(key, argv, ...)`` and marks the test that checks it with
# ``@pytest.mark.subprocess_job(key)``; the test gets the CompletedProcess from
# ``job_result(key)``.  When collection is done, the jobs of the selected tests
# start in a pool of DDTREE_TEST_JOBS (default: the CPU count) threads, longest
# first, and these tests run after the others (their results are ready, or
# nearly, by then): the run uses every core without pytest-xdist.  Under xdist
# (or DDTREE_TEST_JOBS=0) nothing is prefetched: job_result runs the job then.
# Nothing about what a test checks changes: the same subprocess, the same
# assertions on its output.

_JOBS = {}  # key -> dict(argv=, env=, cwd=, timeout=, cost=)
_FUTURES = {}
_LIVE = set()
_LOCK = threading.Lock()
_POOL = None
_TIMES = {}  # key -> (start, end) (time.monotonic), for --durations


def subprocess_job(key, argv, *, env=None, cwd=None, timeout=900, cost=1.0):
    """Register a subprocess job (at import of the test module); returns ``key``."""
    _JOBS[key] = dict(argv=list(argv), env=env, cwd=cwd, timeout=timeout, cost=cost)
    return key


def _run_job(key):
    spec = _JOBS[key]
    t0 = time.monotonic()
    p = subprocess.Popen(spec["argv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=spec["env"], cwd=spec["cwd"])
    with _LOCK:
        _LIVE.add(p)
    try:
        out, err = p.communicate(timeout=spec["timeout"])
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        err += f"\n[job {key}: killed after {spec['timeout']} s]"
    finally:
        with _LOCK:
            _LIVE.discard(p)
        _TIMES[key] = (t0, time.monotonic())
    return subprocess.CompletedProcess(spec["argv"], p.returncode, out, err)


def job_result(key):
    """The CompletedProcess of job ``key`` (prefetched, or run now)."""
    fut = _FUTURES.get(key)
    return fut.result() if fut is not None else _run_job(key)


def _job_key(item):
    m = item.get_closest_marker("subprocess_job")
    return m.args[0] if m is not None else None


def _workers(config):
    if os.environ.get("PYTEST_XDIST_WORKER") or getattr(config.option, "numprocesses", None):
        return 0
    if config.option.collectonly:
        return 0
    return int(os.environ.get("DDTREE_TEST_JOBS") or os.cpu_count() or 1)


def pytest_collection_modifyitems(session, config, items):
    if _workers(config) <= 0:
        return
    # the tests of background jobs last (stable otherwise)
    items.sort(key=lambda it: _job_key(it) is not None)


def pytest_collection_finish(session):
    global _POOL
    n = _workers(session.config)
    keys = []
    for it in session.items:
        k = _job_key(it)
        if k is not None and k in _JOBS and k not in keys:
            keys.append(k)
    if n <= 0 or not keys:
        return
    keys.sort(key=lambda k: -_JOBS[k]["cost"])  # longest first
    _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="ddtree-job")
    for k in keys:
        _FUTURES[k] = _POOL.submit(_run_job, k)


def pytest_sessionfinish(session, exitstatus):
    if _POOL is None:
        return
    for f in _FUTURES.values():
        f.cancel()
    with _LOCK:
        live = list(_LIVE)
    for p in live:  # jobs of tests that did not run (-x, interrupted): ours, by their Popen
        if p.poll() is None:
            p.kill()
    _POOL.shutdown(wait=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.option.durations is None or not _TIMES:
        return
    t0 = min(a for a, _ in _TIMES.values())
    terminalreporter.write_sep("=", "subprocess jobs (start, wall seconds)")
    for k, (a, b) in sorted(_TIMES.items(), key=lambda kv: kv[1][0]):
        terminalreporter.write_line(f"{a - t0:7.1f}s {b - a:7.1f}s  {k}")
