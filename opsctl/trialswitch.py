"""Switch the candidate a live DDTree trial release serves (issue #37), over the host's Connection.

`switch_live(conn, host, control_file, candidate)`:

1. writes `{"active": candidate}` to the control file atomically (a temporary file in the same
   directory, then a rename over the path: the runtime never reads half a file);
2. on the host, in one round trip, until `/server_info`'s `internal_states[0]["ddtree"]["active"]`
   names the candidate: sends warm-up requests (the runtime looks at the control file every
   SGLANG_DDTREE_CONTROL_EVERY_STEPS decode steps, so an idle server applies it only when traffic
   comes), and stops early when the runtime records a new refusal (`last_refusal`);
3. returns what it saw, or raises CheckFailed with the reason (refused, timed out, no DDTree state).

The runtime's `DDTree active: <candidate> (since step N)` journal line says the same as the status.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from opsctl.config import HostConfig
from opsctl.errors import CheckFailed, HostError
from opsctl.host import facts
from opsctl.host.connection import Connection
from opsctl.trialset import control_json

WARMUP_TOKENS = 64   # a request of this many tokens runs more decode steps than a control meeting's 16

# stdlib only: it runs with the host's python3. argv: port, candidate, timeout_s, tokens.
_WAIT_ACTIVE = r'''
import http.client, json, sys, time
port, want, timeout_s, tokens = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])

def call(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=max(30.0, timeout_s))
    try:
        c.request(method, path, None if body is None else json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()

def status():
    try:
        code, data = call("GET", "/server_info")
        states = json.loads(data).get("internal_states") or [] if code == 200 else []
        return (states[0] or {}).get("ddtree") if states else None
    except Exception:
        return None

t0 = time.monotonic()
sent, error = 0, None
seen = status()
refusal_before = (seen or {}).get("last_refusal")
while True:
    seen = status()
    out = {"status": seen, "sent": sent, "seconds": round(time.monotonic() - t0, 2), "error": error}
    if seen is not None and seen.get("active") == want:
        print(json.dumps(dict(out, result="active")))
        break
    if seen is not None and seen.get("last_refusal") and seen.get("last_refusal") != refusal_before:
        print(json.dumps(dict(out, result="refused")))
        break
    if time.monotonic() - t0 > timeout_s:
        print(json.dumps(dict(out, result="timeout")))
        break
    try:
        call("POST", "/generate", {"input_ids": list(range(1000, 1032)),
                                   "sampling_params": {"temperature": 0, "max_new_tokens": tokens,
                                                       "ignore_eos": True}})
        sent += 1
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        time.sleep(0.5)
'''


def write_control(conn: Connection, control_file: str | PurePosixPath, candidate: str) -> None:
    """`{"active": candidate}` at `control_file`, atomically: a temporary file in its directory,
    then a rename over it (the runtime compares (inode, mtime, size) and reads only a changed file)."""
    path = str(control_file)
    d = shlex.quote(str(PurePosixPath(path).parent))
    res = conn.run(f"mkdir -p {d} && t=$(mktemp {d}/.ddtree-active.XXXXXX) && cat > \"$t\" && chmod 0644 \"$t\" "
                   f"&& mv -f \"$t\" {shlex.quote(path)}", stdin=control_json(candidate), check=False)
    if not res.ok:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [f"exit {res.rc}"]
        raise HostError(f"could not write the DDTree control file {path}: {tail[0][:300]}",
                        f"check that {PurePosixPath(path).parent} exists and is writable on the host")


def read_control(conn: Connection, control_file: str | PurePosixPath) -> str | None:
    """The candidate the control file names (None: absent or not a control file)."""
    doc = facts.get(conn, facts.JsonFile(str(control_file)))
    active = (doc or {}).get("active")
    return str(active) if active is not None else None


def remove_control(conn: Connection, control_file: str | PurePosixPath) -> None:
    """Without a control file a trial release serves its trial set's `active` from its next start."""
    conn.run(f"rm -f {shlex.quote(str(control_file))}", check=False)


@dataclass(frozen=True)
class Switched:
    candidate: str
    since_step: int | None     # the first decode step it served (the runtime's count since start)
    seconds: float             # from the control write to the status naming it
    warmup_requests: int

    def as_dict(self) -> dict:
        return {"candidate": self.candidate, "since_step": self.since_step, "seconds": self.seconds,
                "warmup_requests": self.warmup_requests}


def parse_wait(stdout: str, candidate: str, timeout_s: float) -> Switched:
    """The host script's last JSON line -> Switched, or CheckFailed with the reason."""
    doc = None
    for line in reversed(stdout.strip().splitlines()):
        try:
            doc = json.loads(line)
            break
        except ValueError:
            continue
    if not isinstance(doc, dict):
        raise HostError(f"the live switch to {candidate} printed nothing readable", "run it again; see the journal")
    st = doc.get("status") or {}
    if doc.get("result") == "active":
        since = st.get("since_step")
        return Switched(candidate, int(since) if isinstance(since, int) else None, float(doc.get("seconds") or 0),
                        int(doc.get("sent") or 0))
    if doc.get("result") == "refused":
        raise CheckFailed(f"the runtime refused the switch to {candidate}: {st.get('last_refusal')}",
                          "a candidate must be captured at start: it must be in the trial release's candidates")
    if not st:
        raise CheckFailed(f"no switch to {candidate} within {timeout_s:g} s: /server_info shows no DDTree state"
                          + (f" ({doc['error']})" if doc.get("error") else ""),
                          "the runtime reports internal_states[0].ddtree since issue #37: deploy a runtime wheel "
                          "with the trial set, or tune with --restart-per-trial")
    raise CheckFailed(f"no switch to {candidate} within {timeout_s:g} s: still serving {st.get('active')} after "
                      f"{doc.get('sent', 0)} warm-up request(s)"
                      + (f"; last refusal: {st.get('last_refusal')}" if st.get("last_refusal") else "")
                      + (f"; last request error: {doc['error']}" if doc.get("error") else ""),
                      "raise opsctl.tune.switch_timeout_s, or check the server's journal for "
                      "'DDTree control refused'")


def switch_live(conn: Connection, host: HostConfig, control_file: str | PurePosixPath, candidate: str, *,
                timeout_s: float) -> Switched:
    write_control(conn, control_file, candidate)
    argv = [str(host.host_python), "-c", _WAIT_ACTIVE, str(host.http_port), candidate, f"{timeout_s:g}",
            str(WARMUP_TOKENS)]
    res = conn.run(shlex.join(argv), check=False, timeout=timeout_s + 90)
    if not res.ok and not res.stdout.strip():
        tail = (res.stderr.strip().splitlines() or [f"exit {res.rc}"])[-1]
        raise HostError(f"the live switch to {candidate} failed on {host.name}: {tail[:300]}",
                        f"check that the server answers on 127.0.0.1:{host.http_port} on the host")
    return parse_wait(res.stdout, candidate, timeout_s)
