import json
import os
import signal
import subprocess
import sys
import tempfile
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
# The Triton-interpreter checks are single-threaded subprocesses of half a
# minute or so each.  A test module registers each such subprocess with
# ``subprocess_job(key, argv, ...)`` (``interp_job(key, code)``: ``python -c
# code`` under Triton's interpreter) and marks the test that checks it with
# ``@pytest.mark.subprocess_job(key)``; the test gets the CompletedProcess from
# ``job_result(key)``.  When collection is done, the jobs of the selected tests
# start in a pool of DDTREE_TEST_JOBS (default: the CPU count) threads, longest
# first, and these tests run after the others (their results are ready, or
# nearly, by then): the run uses every core without pytest-xdist.
# Under xdist (or DDTREE_TEST_JOBS=0) nothing is prefetched: job_result runs the
# job then (xdist: these tests first, longest first).  Either way the interpreter jobs are forked from one process (per
# pytest process) that has imported torch, triton and sglang_ddtree once
# (``_Zygote``: the same code and environment, a fresh copy of that process per
# job, minus ~4 s of imports each; DDTREE_TEST_ZYGOTE=0: plain subprocesses).
# Nothing about what a test checks changes: the same code, the same assertions
# on its output.

_JOBS = {}  # key -> dict(argv=, env=, cwd=, timeout=, cost=, zygote=)
_FUTURES = {}
_LIVE = set()  # running Popen objects / pids of our jobs
_LOCK = threading.Lock()
_POOL = None
_ZYGOTES = {}
_TIMES = {}  # key -> (start, end) (time.monotonic), for --durations
_CPU = {}  # key -> note (CPU seconds of a forked job)


def interp_env():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([SRC, HERE]))
    env.pop("SGLANG_DDTREE_DISABLE_TRITON", None)
    return env


INTERP_PRELOAD = """
import interp_fast
interp_fast.install()
import numpy, torch, triton
import sglang_ddtree.triton_kernels, sglang_ddtree.head, sglang_ddtree.reference, sglang_ddtree.tree
"""


def subprocess_job(key, argv, *, env=None, cwd=None, timeout=900, cost=1.0, zygote=None):
    """Register a subprocess job (at import of the test module); returns ``key``."""
    _JOBS[key] = dict(argv=list(argv), env=env, cwd=cwd, timeout=timeout, cost=cost, zygote=zygote)
    return key


def interp_job(key, code, *, timeout=1200, cost=1.0):
    """``python -c code`` under Triton's interpreter (PYTHONPATH: src, tests)."""
    return subprocess_job(key, [sys.executable, "-c", code], env=interp_env(), timeout=timeout, cost=cost,
                          zygote="interp")


_ZYGOTE_LOOP = r"""
import json, os, resource, signal, sys, traceback
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the job processes
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the job: a copy of this process, stdout / stderr to files
        rc = 1
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_TRUNC),
                                    (2, req["err"], os.O_WRONLY | os.O_TRUNC)):
                f = os.open(path, flags)
                os.dup2(f, fd)
                os.close(f)
            if req["cwd"]:
                os.chdir(req["cwd"])
            rc = 0
            try:
                exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                rc = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                ru = resource.getrusage(resource.RUSAGE_SELF)
                with open(req["rc"] + ".tmp", "w") as f:
                    f.write(f"{rc} {ru.ru_utime + ru.ru_stime:.1f}")
                os.rename(req["rc"] + ".tmp", req["rc"])
            finally:
                os._exit(rc)
    sys.stdout.write(f"{pid}\n")
    sys.stdout.flush()
"""


class _Zygote:
    """One process with the interpreter jobs' imports done; each job is a fork of it."""

    def __init__(self, env, preload):
        self.p = subprocess.Popen([sys.executable, "-c", preload + _ZYGOTE_LOOP], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env, cwd=HERE)
        self.lock = threading.Lock()

    def run(self, key, spec):
        """CompletedProcess of the job, or None when the zygote is gone (then: a plain subprocess)."""
        with tempfile.TemporaryDirectory(prefix="ddtree-job-") as d:
            paths = {n: os.path.join(d, n) for n in ("out", "err", "rc")}
            for n in ("out", "err"):
                open(paths[n], "w").close()
            req = dict(paths, code=spec["argv"][2], cwd=spec["cwd"])
            with self.lock:
                try:
                    self.p.stdin.write(json.dumps(req) + "\n")
                    self.p.stdin.flush()
                    line = self.p.stdout.readline()
                except (BrokenPipeError, OSError, ValueError):
                    line = ""
            if not line.strip():
                return None
            pid = int(line)
            with _LOCK:
                _LIVE.add(pid)
            deadline = time.monotonic() + spec["timeout"]
            note = ""
            try:
                while not os.path.exists(paths["rc"]):
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:  # gone without a status (killed)
                        if not os.path.exists(paths["rc"]):
                            note = f"\n[job {key}: process {pid} ended without a status]"
                        break
                    if time.monotonic() > deadline:
                        os.kill(pid, signal.SIGKILL)
                        note = f"\n[job {key}: killed after {spec['timeout']} s]"
                        break
                    time.sleep(0.05)
            finally:
                with _LOCK:
                    _LIVE.discard(pid)
            rc, cpu = open(paths["rc"]).read().split() if os.path.exists(paths["rc"]) else (-9, "?")
            out, err = open(paths["out"]).read(), open(paths["err"]).read() + note
        _CPU[key] = f"{cpu} s cpu, forked"
        return subprocess.CompletedProcess(spec["argv"], int(rc), out, err)

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        self.p.kill()
        self.p.wait()


def _zygote(name):
    with _LOCK:
        z = _ZYGOTES.get(name)
        if z is None and name == "interp":
            z = _ZYGOTES[name] = _Zygote(interp_env(), INTERP_PRELOAD)
    return z


def _run_job(key):
    spec = _JOBS[key]
    t0 = time.monotonic()
    try:
        if spec["zygote"] and os.environ.get("DDTREE_TEST_ZYGOTE", "1") != "0":
            z = _zygote(spec["zygote"])
            res = z.run(key, spec) if z is not None else None
            if res is not None:
                return res
        return _popen_job(key, spec)
    finally:
        _TIMES[key] = (t0, time.monotonic())


def _popen_job(key, spec):
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
    return subprocess.CompletedProcess(spec["argv"], p.returncode, out, err)


def job_result(key):
    """The CompletedProcess of job ``key`` (prefetched, or run now)."""
    fut = _FUTURES.get(key)
    return fut.result() if fut is not None else _run_job(key)


def _job_key(item):
    m = item.get_closest_marker("subprocess_job")
    return m.args[0] if m is not None else None


def _xdist(config):
    return bool(os.environ.get("PYTEST_XDIST_WORKER") or getattr(config.option, "numprocesses", None))


def _workers(config):
    if _xdist(config) or config.option.collectonly:
        return 0
    return int(os.environ.get("DDTREE_TEST_JOBS") or os.cpu_count() or 1)


def _cost(item):
    k = _job_key(item)
    return _JOBS[k]["cost"] if k in _JOBS else 0.0


def pytest_collection_modifyitems(session, config, items):
    if _xdist(config):
        # xdist: the job tests first, longest first (the workers take the rest as they
        # free up: no long test left alone at the end); the same order in every worker
        items.sort(key=lambda it: -_cost(it))
    elif _workers(config) > 0:
        # prefetched: the job tests last (stable otherwise), their results ready by then
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
    for f in _FUTURES.values():
        f.cancel()
    with _LOCK:
        live = list(_LIVE)
    for p in live:  # jobs of tests that did not run (-x, interrupted): ours, by their Popen / pid
        if isinstance(p, int):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        elif p.poll() is None:
            p.kill()
    if _POOL is not None:
        _POOL.shutdown(wait=True)
    for z in _ZYGOTES.values():
        z.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.option.durations is None or not _TIMES:
        return
    t0 = min(a for a, _ in _TIMES.values())
    terminalreporter.write_sep("=", "subprocess jobs (start, wall seconds)")
    for k, (a, b) in sorted(_TIMES.items(), key=lambda kv: kv[1][0]):
        terminalreporter.write_line(f"{a - t0:7.1f}s {b - a:7.1f}s  {k}  {_CPU.get(k, '')}")
