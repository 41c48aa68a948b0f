"""What the host says, read one way: each fact is a shell command and the parser of its
output (pyinfra's facts are the model: a fact's `command()` and `process()`), tested with
captured output and used by the deploy flow, status and the checks.

`get(conn, fact)` runs one fact; `gather(conn, *facts)` runs several in one SSH round trip
(the readiness probe asks four questions a second). Inside `with cached(conn):` (a run that only
reads: plan, status, report) each fact is read from the host once and asked again from memory.
"""
from __future__ import annotations

import json
import re
import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Generic, Iterator, TypeVar

from opsctl.errors import HostError
from opsctl.host.connection import Connection, Result
from opsctl.onhost.ledger_records import fold_switches

# opsctl.journal (its parsers: some 40 patterns, a dozen dataclasses) is imported by the facts that
# read the journal, when they run: status, history and the watch's status read none

T = TypeVar("T")


class Fact(Generic[T]):
    """A command whose output answers one question about the host."""

    def command(self) -> str:  # pragma: no cover - every fact defines it
        raise NotImplementedError

    def process(self, stdout: str) -> T:  # pragma: no cover - every fact defines it
        raise NotImplementedError

    def check(self, result: Result) -> None:
        """A fact whose command must succeed raises here (most facts read a failure as 'none')."""


# the per-run cache: {id(connection): {fact: value}} while a `cached(conn)` block is open (the block
# holds the connection, so its id is not reused before the entry goes)
_CACHES: dict[int, dict] = {}


@contextmanager
def cached(conn: Connection) -> Iterator[None]:
    """Within the block, a fact (an equal frozen dataclass) is read from the host once: get() and
    gather() answer a second ask from the first read. For a run that reads only (a deploy's plan,
    status, report): host state must not change under it; a block that writes calls forget().
    Nested blocks share the outer one's cache."""
    outer = id(conn) in _CACHES
    if not outer:
        _CACHES[id(conn)] = {}
    try:
        yield
    finally:
        if not outer:
            _CACHES.pop(id(conn), None)


def forget(conn: Connection) -> None:
    """Drop what the open cached() block has read (after the block changed the host)."""
    if id(conn) in _CACHES:
        _CACHES[id(conn)].clear()


def _key(fact: Fact) -> Fact | None:
    try:
        hash(fact)
    except TypeError:   # a fact with a list field: asked each time
        return None
    return fact


def get(conn: Connection, fact: Fact[T], *, timeout: float = 60) -> T:
    cache, key = _CACHES.get(id(conn)), _key(fact)
    if cache is not None and key is not None and key in cache:
        return cache[key]
    res = conn.run(fact.command(), check=False, timeout=timeout)
    fact.check(res)
    value = fact.process(res.stdout)
    if cache is not None and key is not None:
        cache[key] = value
    return value


_MARK = "--opsctl-fact-{n}--"


def gather(conn: Connection, *facts: Fact, timeout: float = 60) -> tuple:
    """Several facts in one round trip: each command's output framed by a marker line (inside
    cached(), only the facts not read yet travel)."""
    cache = _CACHES.get(id(conn))
    if cache is not None:
        keys = [_key(f) for f in facts]
        missing = [f for f, k in zip(facts, keys) if k is None or k not in cache]
        read = iter(_gather(conn, missing, timeout) if missing else ())
        values = []
        for f, k in zip(facts, keys):
            if k is not None and k in cache:
                values.append(cache[k])
            else:
                v = next(read)
                if k is not None:
                    cache[k] = v
                values.append(v)
        return tuple(values)
    return _gather(conn, facts, timeout)


def _gather(conn: Connection, facts, timeout: float) -> tuple:
    script = "; ".join(f"( {f.command()} ) 2>/dev/null; echo; echo {_MARK.format(n=i)}" for i, f in enumerate(facts))
    out = conn.run(script, check=False, timeout=timeout).stdout
    values = []
    for i, fact in enumerate(facts):
        mark = _MARK.format(n=i)
        head, _, out = out.partition(mark)  # no marker: the host cut the output short; what is there parses
        out = out[1:] if out.startswith("\n") else out
        values.append(fact.process(head[:-1] if head.endswith("\n") else head))
    return tuple(values)


# --------------------------------------------------------------------------- the service


SERVICE_PROPS = ("ActiveState", "SubState", "NRestarts", "MainPID", "Result", "ActiveEnterTimestamp",
                 "UnitFileState", "InvocationID")


@dataclass(frozen=True)
class ServiceState(Fact[dict]):
    """`systemctl show` properties of the unit (empty dict: no such unit or no systemd)."""

    unit: str
    props: tuple[str, ...] = SERVICE_PROPS

    def command(self) -> str:
        return f"systemctl show {shlex.quote(self.unit)} " + " ".join(f"-p {p}" for p in self.props)

    def process(self, stdout: str) -> dict:
        return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


@dataclass(frozen=True)
class ServiceStartEpoch(Fact["int | None"]):
    """When the unit's main process started, in the host's epoch seconds (None: not running)."""

    unit: str

    def command(self) -> str:
        return (f"t=$(systemctl show {shlex.quote(self.unit)} -p ExecMainStartTimestamp --value); "
                f"[ -n \"$t\" ] && [ \"$t\" != n/a ] && date -d \"$t\" +%s")

    def process(self, stdout: str) -> int | None:
        text = stdout.strip()
        return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class HealthCode(Fact[int]):
    """HTTP status of GET /health_generate on the host's loopback (0: no answer)."""

    python: str
    port: int
    timeout_s: float = 25

    def command(self) -> str:
        # a bare socket, not urllib: urllib.request imports ssl and email, three times the host CPU
        # of the request itself, and readiness asks this every quarter second
        py = ("import socket\n"
              "try:\n"
              f"    s = socket.create_connection(('127.0.0.1', {int(self.port)}), timeout={float(self.timeout_s)})\n"
              f"    s.sendall(b'GET /health_generate HTTP/1.0\\r\\nHost: 127.0.0.1:{int(self.port)}\\r\\n\\r\\n')\n"
              "    status = s.makefile('rb').readline().split()\n"
              "    print(int(status[1]) if len(status) > 1 and status[1].isdigit() else 0)\n"
              "except Exception:\n    print(0)\n")
        return f"{shlex.quote(self.python)} -c {shlex.quote(py)}"

    def process(self, stdout: str) -> int:
        text = stdout.strip().splitlines()[-1:] or ["0"]
        return int(text[0]) if text[0].isdigit() else 0


@dataclass(frozen=True)
class Loads(Fact["object"]):
    """SGLang 0.5.23's `GET /v1/loads` on the host's loopback, as opsctl.drain.Load (running and
    waiting requests over every DP rank); None: no answer (the server is gone or not up).
    0.5.23 has no `/get_load` (entrypoints/v1_loads.py is its load endpoint)."""

    python: str
    port: int
    timeout_s: float = 10

    def command(self) -> str:
        py = loopback_get_py(self.port, "/v1/loads", self.timeout_s,
                             "print(body.decode('utf-8', 'replace') if ok else '')", "print('')")
        return f"{shlex.quote(self.python)} -c {shlex.quote(py)}"

    def process(self, stdout: str):
        from opsctl.drain import parse_loads

        return parse_loads(stdout.strip())


# --------------------------------------------------------------------------- the journal


def loopback_get_py(port: int, path: str, timeout_s: float, on_answer: str, on_error: str) -> str:
    """A standard-library Python program for the host's python3: GET http://127.0.0.1:PORT/PATH
    (HTTP/1.0), then `on_answer` runs with `ok` (a 200) and `body` (bytes); `on_error` when the
    server does not answer. One statement each."""
    return ("import json, socket\n"
            "try:\n"
            f"    s = socket.create_connection(('127.0.0.1', {int(port)}), timeout={float(timeout_s)})\n"
            f"    s.sendall(b'GET {path} HTTP/1.0\\r\\nHost: 127.0.0.1:{int(port)}\\r\\n\\r\\n')\n"
            "    data = b''\n"
            "    while True:\n"
            "        chunk = s.recv(65536)\n"
            "        if not chunk:\n"
            "            break\n"
            "        data += chunk\n"
            "    head, _, body = data.partition(b'\\r\\n\\r\\n')\n"
            "    status = head.split(b'\\r\\n', 1)[0].split()\n"
            "    ok = len(status) > 1 and status[1] == b'200'\n"
            f"    {on_answer}\n"
            "except Exception:\n"
            f"    {on_error}\n")


def _since(since: int | float | str) -> str:
    return f"@{int(since)}" if isinstance(since, (int, float)) else str(since)


@dataclass(frozen=True)
class ReadyLines(Fact[int]):
    """How many times the server printed SGLang's ready line since `since`."""

    unit: str
    since: int | float | str

    def command(self) -> str:
        from opsctl.journal import READY_LINE

        return (f"journalctl -u {shlex.quote(self.unit)} --since {shlex.quote(_since(self.since))} -o cat --no-pager "
                f"| grep -c -F {shlex.quote(READY_LINE)}")

    def process(self, stdout: str) -> int:
        text = stdout.strip()
        return int(text) if text.isdigit() else 0


CAUSE_PATTERN = "address already in use|capture cuda graph failed|out of memory|cuda error|illegal memory|error|exception"


@dataclass(frozen=True)
class CauseLines(Fact[list]):
    """The journal lines since `since` that may say why a server failed (journal.first_cause
    picks the most specific)."""

    unit: str
    since: int | float | str
    limit: int = 60

    def command(self) -> str:
        return (f"journalctl -u {shlex.quote(self.unit)} --since {shlex.quote(_since(self.since))} -o cat --no-pager "
                f"| grep -i -E {shlex.quote(CAUSE_PATTERN)} | head -n {int(self.limit)} | cut -c1-300")

    def process(self, stdout: str) -> list[str]:
        return [line for line in stdout.splitlines() if line.strip()]


_JOURNAL_FIX = "check the unit name and that the login user may read the journal (root or systemd-journal group)"


@dataclass(frozen=True)
class JournalWindow(Fact[list]):
    """The unit's journal entries since `since` (epoch seconds or any `journalctl --since`
    value), as journal.parse() takes them. A journal that cannot be read is a HostError."""

    unit: str
    since: int | float | str

    def command(self) -> str:
        # --all: without it journald writes a field over 4096 bytes as null, SGLang's server_args line
        # (the launch args: a DDTree server, its budget) among them (issue #49)
        return (f"journalctl -u {shlex.quote(self.unit)} -o json --all --since {shlex.quote(_since(self.since))} "
                f"--no-pager; echo \"#rc=$?\"")

    def check(self, result: Result) -> None:
        rc = result.stdout.rstrip("\n").rpartition("#rc=")[2].strip() if "#rc=" in result.stdout else str(result.rc)
        if rc != "0":
            tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or [""]
            raise HostError(f"journalctl for {self.unit} failed on {result.host or 'the host'} (exit {rc}): "
                            f"{tail[0][:300]}", _JOURNAL_FIX)

    def process(self, stdout: str) -> list[dict]:
        from opsctl.journal import load_entries_json

        body, mark, rc = stdout.rstrip("\n").rpartition("#rc=")
        if not mark:
            body, rc = stdout, "0"
        if rc.strip() != "0":
            raise HostError(f"journalctl for {self.unit} failed (exit {rc.strip()}): {body.strip()[-300:]}",
                            _JOURNAL_FIX)
        try:
            return load_entries_json(body)
        except ValueError as exc:
            raise HostError(f"journalctl -o json output does not parse: {exc}",
                            "run the journalctl command by hand on the host to see what it prints") from None


# --------------------------------------------------------------------------- files and disks


@dataclass(frozen=True)
class HostTime(Fact[int]):
    """The host's clock, epoch seconds (journal windows are in host time)."""

    def command(self) -> str:
        return "date +%s"

    def process(self, stdout: str) -> int:
        text = stdout.strip()
        if not text.isdigit():
            raise HostError(f"the host's 'date +%s' printed {text[:60]!r}", "check the host's coreutils and clock")
        return int(text)


@dataclass(frozen=True)
class DiskFree(Fact["int | None"]):
    """Bytes free for a path (its nearest existing parent); None: no df on the host."""

    path: str

    def command(self) -> str:
        return (f"d={shlex.quote(str(self.path))}; while [ ! -d \"$d\" ]; do d=$(dirname \"$d\"); done; "
                f"df -P -B1 \"$d\" | awk 'NR==2 {{print $4}}'")

    def process(self, stdout: str) -> int | None:
        lines = stdout.strip().splitlines()
        return int(lines[-1]) if lines and lines[-1].strip().isdigit() else None


@dataclass(frozen=True)
class FileExists(Fact[bool]):
    """Whether a path exists on the host. Only a clear "no" is False: output cut short is not
    read as a missing file (the ledger's absence is reported to the operator, issue #32 item 8)."""

    path: str

    def command(self) -> str:
        return f"if [ -e {shlex.quote(str(self.path))} ]; then echo yes; else echo no; fi"

    def process(self, stdout: str) -> bool:
        return stdout.strip() != "no"


@dataclass(frozen=True)
class IsFile(Fact[bool]):
    """Whether a regular file is there. Only a clear "yes" is True (a marker file that says an
    environment is complete: output cut short reads as not complete, and it is built again)."""

    path: str

    def command(self) -> str:
        return f"if [ -f {shlex.quote(str(self.path))} ]; then echo yes; else echo no; fi"

    def process(self, stdout: str) -> bool:
        return stdout.strip() == "yes"


@dataclass(frozen=True)
class NonEmptyFiles(Fact[bool]):
    """Whether every one of `paths` is a file with something in it (`test -s`); a clear yes only."""

    paths: tuple[str, ...]

    def command(self) -> str:
        tests = " && ".join(f"[ -s {shlex.quote(str(p))} ]" for p in self.paths)
        return f"if {tests}; then echo yes; else echo no; fi"

    def process(self, stdout: str) -> bool:
        return stdout.strip() == "yes"


_ABSENT = "--opsctl-no-file--"


@dataclass(frozen=True)
class TextFile(Fact["str | None"]):
    """A text file's contents (None: absent or unreadable; "" an empty file)."""

    path: str

    def command(self) -> str:
        q = shlex.quote(str(self.path))
        return f"if [ -f {q} ] && [ -r {q} ]; then echo; cat {q}; else echo {_ABSENT}; fi"

    def process(self, stdout: str) -> str | None:
        head, _, body = stdout.partition("\n")
        return None if head.strip() == _ABSENT or not _ else body


@dataclass(frozen=True)
class FirstLines(Fact[list]):
    """The first line of each non-empty file `<directory>/<prefix>*<suffix>` (sorted by name)."""

    directory: str
    prefix: str
    suffix: str

    def command(self) -> str:
        return (f"for f in {shlex.quote(str(self.directory))}/{shlex.quote(self.prefix)}*{shlex.quote(self.suffix)}; "
                "do [ -s \"$f\" ] && head -n 1 \"$f\"; done; true")

    def process(self, stdout: str) -> list[str]:
        return [line for line in stdout.splitlines() if line.strip()]


@dataclass(frozen=True)
class JitCaches(Fact[dict]):
    """What the host's shared JIT caches hold (issue #51): FlashInfer's built modules per
    `<flashinfer version>/<archs>` under SGLANG_CACHE_DIR (`<root>/shared/cache/sglang`, where SGLang
    0.5.23 points FLASHINFER_WORKSPACE_BASE), SGLang's JIT builds (`<root>/shared/cache/sglang-jit`,
    one `.so` per build leaf) and Inductor's files. Nothing there: zeros."""

    root: str

    def command(self) -> str:
        c = shlex.quote(str(PurePosixPath(self.root) / "shared" / "cache"))
        return (f"cd {c} 2>/dev/null || exit 0; "
                "for f in sglang/.cache/flashinfer/*/*/cached_ops/*/*.so; do [ -f \"$f\" ] && echo \"fi $f\"; done; "
                "for f in sglang-jit/*/*/build-*/deps-*/*.so; do [ -f \"$f\" ] && echo \"sg $f\"; done; "
                "[ -d sglang/inductor ] && echo \"ind $(find sglang/inductor -type f | wc -l)\"; true")

    def process(self, stdout: str) -> dict:
        flashinfer: dict[str, list[str]] = {}
        sglang_jit: list[str] = []
        inductor = 0
        for line in stdout.splitlines():
            kind, _, rest = line.partition(" ")
            parts = rest.split("/")
            if kind == "fi" and len(parts) == 8:   # sglang/.cache/flashinfer/VER/ARCH/cached_ops/NAME/NAME.so
                flashinfer.setdefault(f"{parts[3]}/{parts[4]}", []).append(parts[6])
            elif kind == "sg" and len(parts) == 6:   # sglang-jit/TARGET/MODULE/build-K/deps-K/MODULE.so
                sglang_jit.append(f"{parts[1]}/{parts[2]}")
            elif kind == "ind" and rest.strip().isdigit():
                inductor = int(rest)
        return {"flashinfer": {k: sorted(v) for k, v in sorted(flashinfer.items())},
                "sglang_jit": sorted(set(sglang_jit)), "inductor_files": inductor}


@dataclass(frozen=True)
class CurrentRelease(Fact["str | None"]):
    """The release the `current` link points at (None: no link)."""

    root: str

    def command(self) -> str:
        return f"readlink {shlex.quote(str(self.root))}/current"

    def process(self, stdout: str) -> str | None:
        name = PurePosixPath(stdout.strip()).name if stdout.strip() else ""
        return name if name not in ("", ".") else None


@dataclass(frozen=True)
class ReleaseManifests(Fact[dict]):
    """{release id: manifest} of every complete release (a release without a manifest is not one)."""

    root: str

    def command(self) -> str:
        return (f"cd {shlex.quote(str(self.root))} && for m in releases/*/manifest.json; do [ -f \"$m\" ] && "
                f"echo \"$(basename $(dirname $m)) $(tr -d '\\n' < $m)\"; done")

    def process(self, stdout: str) -> dict[str, dict]:
        out = {}
        for line in stdout.splitlines():
            rid, _, body = line.partition(" ")
            try:
                manifest = json.loads(body)
            except ValueError:
                continue
            if rid and isinstance(manifest, dict):
                out[rid] = manifest
        return out


@dataclass(frozen=True)
class LedgerRecords(Fact[tuple]):
    """(records, problems): the host's ledger; a line that is not a JSON record is reported
    with its line number and skipped."""

    root: str

    def command(self) -> str:
        return f"cat {shlex.quote(str(self.root))}/ledger.jsonl"

    def process(self, stdout: str) -> tuple[list[dict], list[str]]:
        records: list[dict] = []
        problems: list[str] = []
        for no, body in enumerate(stdout.splitlines(), 1):
            if not body.strip():
                continue
            try:
                rec: Any = json.loads(body)
            except ValueError as exc:
                problems.append(f"line {no}: not JSON ({exc.msg}): {body[:80]!r}")
                continue
            if not isinstance(rec, dict):
                problems.append(f"line {no}: not a record (a JSON {type(rec).__name__}): {body[:80]!r}")
                continue
            records.append(rec)
        return fold_switches(records), problems


# --------------------------------------------------------------------------- this start of the unit


@dataclass(frozen=True)
class StartJournal(Fact[dict]):
    """The journal of the unit's current start (its InvocationID): {"invocation", "lines",
    "ready" (count of the ready line), "failures" (up to 3 'Capture cuda graph failed' lines)}.
    An empty invocation: the unit was never started."""

    unit: str

    def command(self) -> str:
        from opsctl.journal import READY_LINE

        unit = shlex.quote(self.unit)
        return (f"inv=$(systemctl show -p InvocationID --value {unit}); echo \"INV=$inv\"; "
                f"[ -n \"$inv\" ] || exit 0; t=$(mktemp); "
                f"journalctl _SYSTEMD_INVOCATION_ID=$inv -o cat --no-pager > \"$t\"; "
                f"echo \"LINES=$(wc -l < \"$t\")\"; echo \"READY=$(grep -c -F {shlex.quote(READY_LINE)} \"$t\")\"; "
                f"grep -F 'Capture cuda graph failed' \"$t\" | head -3 | sed 's/^/FAIL /'; rm -f \"$t\"")

    def process(self, stdout: str) -> dict:
        out: dict = {"invocation": "", "lines": 0, "ready": 0, "failures": []}
        for line in stdout.splitlines():
            if line.startswith("INV="):
                out["invocation"] = line[4:].strip()
            elif line.startswith("LINES="):
                out["lines"] = int(line[6:].strip() or 0)
            elif line.startswith("READY="):
                out["ready"] = int(line[6:].strip() or 0)
            elif line.startswith("FAIL "):
                out["failures"].append(line[5:])
        return out


# --------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GPU:
    index: int
    uuid: str
    name: str
    total_mib: int
    used_mib: int
    driver: str


@dataclass(frozen=True)
class ComputeApp:
    pid: int
    gpu_uuid: str
    used_mib: int


def _mib(value: str) -> int:
    value = value.strip()
    m = re.match(r"^(\d+(?:\.\d+)?)\s*(MiB)?$", value)
    if not m:
        raise ValueError(f"not a MiB value: {value!r}")
    return int(float(m.group(1)))


def _csv_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


GPU_QUERY = "index,uuid,name,memory.total,memory.used,driver_version"
APPS_QUERY = "pid,gpu_uuid,used_memory"


@dataclass(frozen=True)
class Gpus(Fact[list]):
    """The host's GPUs, from nvidia-smi (a malformed row is a ValueError: the caller says so)."""

    def command(self) -> str:
        return f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits"

    def process(self, stdout: str) -> list[GPU]:
        out = []
        for row in _csv_rows(stdout):
            if len(row) < 6:
                raise ValueError(f"unexpected nvidia-smi row: {', '.join(row)!r}")
            # a GPU name may itself hold a comma: everything between uuid and the last 3 fields
            index, uuid, *name, total, used, driver = row
            out.append(GPU(int(index), uuid, ", ".join(name), _mib(total), _mib(used), driver))
        return out


@dataclass(frozen=True)
class GpuProcesses(Fact[list]):
    """Processes holding GPU memory, one row per (process, GPU); unknown memory ('[N/A]') is 0."""

    def command(self) -> str:
        return f"nvidia-smi --query-compute-apps={APPS_QUERY} --format=csv,noheader,nounits"

    def process(self, stdout: str) -> list[ComputeApp]:
        out = []
        for row in _csv_rows(stdout):
            if len(row) < 3 or not row[0].isdigit():
                continue
            try:
                mib = _mib(row[2])
            except ValueError:
                mib = 0
            out.append(ComputeApp(int(row[0]), row[1], mib))
        return out


@dataclass(frozen=True)
class GpuArch(Fact["str | None"]):
    """The GPUs' architecture as the Triton compiler names it: compute_cap "12.0" -> "sm_120"
    (None: nvidia-smi printed none). GPUs of two architectures on one host are a HostError:
    one release's kernels are compiled for one."""

    def command(self) -> str:
        return "nvidia-smi --query-gpu=compute_cap --format=csv,noheader"

    def process(self, stdout: str) -> str | None:
        caps = sorted({line.strip() for line in stdout.splitlines() if re.fullmatch(r"\d+\.\d+", line.strip())})
        if len(caps) > 1:
            raise HostError(f"the host's GPUs have different compute capabilities ({', '.join(caps)})",
                            "run a release on GPUs of one kind (CUDA_VISIBLE_DEVICES in opsctl.extra_env)")
        if not caps:
            return None
        major, minor = caps[0].split(".")
        return f"sm_{int(major) * 10 + int(minor)}"


@dataclass(frozen=True)
class JsonFile(Fact["dict | None"]):
    """A JSON object file on the host (None: absent, unreadable or not a JSON object)."""

    path: str

    def command(self) -> str:
        return f"cat {shlex.quote(str(self.path))}"

    def process(self, stdout: str) -> dict | None:
        try:
            doc = json.loads(stdout)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None


@dataclass(frozen=True)
class PythonPackages(Fact[dict]):
    """{name: installed version or None} in a Python environment on the host, from its package
    metadata (nothing is imported: torch alone costs seconds). Every name None when that Python
    does not run."""

    python: str
    names: tuple[str, ...]

    def command(self) -> str:
        py = ("import json, importlib.metadata as m\n"
              "def v(n):\n"
              "    try:\n        return m.version(n)\n"
              "    except Exception:\n        return None\n"
              f"print(json.dumps({{n: v(n) for n in {list(self.names)!r}}}))\n")
        return f"{shlex.quote(self.python)} -c {shlex.quote(py)}"

    def process(self, stdout: str) -> dict:
        out: dict = {n: None for n in self.names}
        for line in reversed(stdout.strip().splitlines()):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.update({n: doc.get(n) if isinstance(doc.get(n), str) else None for n in self.names})
                break
        return out
