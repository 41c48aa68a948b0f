"""Releases on a host: ids, what is live, the ledger, and the deploy lock.

A release id is content-addressed (profile slug + digest of rendered files and
shipped artifacts), so deploying the same thing twice names the same release and
changes nothing. The ledger (`<root>/ledger.jsonl`) is append-only and lives on the
host, so every controller sees the same history.
"""
from __future__ import annotations

import contextlib
import contextvars
import getpass
import hashlib
import json
import os
import shlex
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

from opsctl.config import HostConfig, Profile
from opsctl.errors import HostError, LockHeldError
from opsctl.host import facts
from opsctl.host.connection import Connection, SSHConnection


def release_id(profile_slug: str, rendered_digest: str, runtime_sha: str | None, drafter_digest: str | None,
               secrets_sha: str | None = None) -> str:
    """Content address of a release. `secrets_sha` (a hash of the secrets file's content, never
    the values) makes a rotated secret a new release."""
    parts = [rendered_digest, runtime_sha or "-", drafter_digest or "-"] + ([secrets_sha] if secrets_sha else [])
    h = hashlib.sha256("\0".join(parts).encode())
    return f"{profile_slug}-{h.hexdigest()[:10]}"


def profile_slug(rid: str) -> str:
    """The profile slug a release id starts with (`ddtree-b16` of `ddtree-b16-3ca2783571`):
    what a start of the release is compared under (the same profile and budget)."""
    return rid.rsplit("-", 1)[0] if "-" in rid else rid


def who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ReleaseInfo:
    id: str
    manifest: dict

    @property
    def profile(self) -> str:
        return self.manifest.get("profile", {}).get("name", "?")

    @property
    def kind(self) -> str:
        return self.manifest.get("profile", {}).get("kind", "?")

    @property
    def budget(self) -> int | None:
        return self.manifest.get("profile", {}).get("budget")

    @property
    def budget_schedule(self) -> str | None:
        return self.manifest.get("profile", {}).get("budget_schedule")

    @property
    def trial_set(self) -> list[str] | None:
        """The candidates of a trial release (opsctl tune), captured at one start."""
        return self.manifest.get("profile", {}).get("trial_set")

    @property
    def label(self) -> str:
        if self.trial_set:
            from opsctl.trialset import describe

            return f"{self.profile} --trial-set {describe(self.trial_set)}"
        if self.budget_schedule:
            return f"{self.profile} --budget-schedule {self.budget_schedule}"
        return f"{self.profile} --budget {self.budget}" if self.budget else self.profile

    @property
    def created_at(self) -> str:
        return self.manifest.get("created_at", "")


@dataclass
class HostState:
    current: str | None
    releases: dict[str, ReleaseInfo] = field(default_factory=dict)
    ledger: list[dict] = field(default_factory=list)
    service: dict[str, str] = field(default_factory=dict)
    ledger_errors: list[str] = field(default_factory=list)  # "line N: why", for lines skipped on read
    ledger_exists: bool = True  # False: <root>/ledger.jsonl is not there (never written, or deleted)

    @property
    def current_release(self) -> ReleaseInfo | None:
        return self.releases.get(self.current) if self.current else None

    def last_good(self, exclude: str | Iterable[str] | None = None) -> str | None:
        """The newest release that was promoted (passed its gates) or put back by a
        rollback, other than `exclude`, that still exists on the host. An operator's
        rollback is not a verdict: a release whose gate verdict failed is never last good,
        even while it serves after `rollback --to RELEASE --force`."""
        good = self.good_releases(exclude)
        return good[0] if good else None

    def good_releases(self, exclude: str | Iterable[str] | None = None) -> list[str]:
        """Every release `last_good` could name, newest first: what a rollback tries in turn
        when the one before it does not become ready (issue #32 item 5)."""
        skip = {exclude} if isinstance(exclude, str) else set(exclude or ())
        rejected: set[str] = set()  # rolled back from by the host-side watch after it was promoted
        out: list[str] = []
        for rec in reversed(self.ledger):
            rel = rec.get("to_release")
            if rec.get("action") == "rollback" and rec.get("result") == "ok" and rec.get("watch") \
                    and rec.get("from_release"):
                rejected.add(rec["from_release"])
            if rec.get("action") in ("promote", "rollback") and rec.get("result") == "ok" and rel \
                    and not rec.get("forced") and rel not in skip and rel in self.releases and rel not in rejected \
                    and rel not in out and self.gate_failed(rel) is None:
                out.append(rel)
        return out

    def live_not_ready(self) -> dict | None:
        """The record that switched to the live release and found it NOT ready (a rollback, the
        guard's or a controller's, whose target did not start), while no later record switched to
        it again: the live release is not serving, whatever its old verdict says."""
        if not self.current:
            return None
        for rec in reversed(self.ledger):
            if rec.get("to_release") != self.current:
                continue
            act, res = rec.get("action"), rec.get("result")
            if act == "rollback" and res == "failed" and rec.get("switched", True):
                return rec
            if act in ("promote", "rollback") or (act == "deploy" and res in ("started", "unchanged")):
                return None
        return None

    @property
    def ledger_lost(self) -> bool:
        """Releases are on the host but its ledger is gone (deleted) or empty: no verdict, no last
        good release can be known from it (issue #32 item 8)."""
        return bool(self.releases) and not self.ledger and not self.ledger_errors

    def gate_failed(self, release: str | None) -> dict | None:
        """The newest gate verdict of `release` if that verdict failed, else None (passed,
        or never benchmarked)."""
        verdict = self.verdict_for(release)
        return verdict if verdict is not None and verdict.get("status") != "pass" else None

    def judged(self, release: str) -> bool:
        """Did the newest ledger record about `release` judge it good (promoted, or put
        back by a rollback)? A deploy that started or was interrupted after it did not."""
        for rec in reversed(self.ledger):
            if rec.get("to_release") != release or rec.get("switched") is False:
                continue  # (a record that never switched to it says nothing about it)
            if rec.get("action") in ("promote", "rollback"):
                return rec.get("result") == "ok" and not rec.get("forced") and self.gate_failed(release) is None
            if rec.get("action") == "deploy" and (rec.get("result") == "started" or
                                                  (rec.get("result") == "interrupted" and rec.get("switched"))):
                return False
        return False

    def verdict_for(self, release: str | None) -> dict | None:
        """The newest gate verdict of `release` (None for a release never benchmarked)."""
        if not release:
            return None
        for rec in reversed(self.ledger):
            if rec.get("action") == "verdict" and rec.get("release") == release:
                return rec
        return None

    def interrupted_deploy(self) -> dict | None:
        """The last deploy record if that deploy never finished (interrupted, or the
        controller died): started/interrupted with no promote/rollback after it."""
        for rec in reversed(self.ledger):
            act, res = rec.get("action"), rec.get("result")
            if act in ("promote", "rollback"):
                return None
            if act == "deploy" and res in ("started", "interrupted"):
                return rec
            if act == "deploy":
                return None
        return None

    def baseline(self, baseline_profile: str) -> str | None:
        cands = [r for r in self.releases.values() if r.profile == baseline_profile]
        cands.sort(key=lambda r: r.created_at)
        good = {rec.get("to_release") for rec in self.ledger if rec.get("result") == "ok"}
        preferred = [r for r in cands if r.id in good]
        return (preferred or cands)[-1].id if (preferred or cands) else None

    def last_verdict(self) -> dict | None:
        for rec in reversed(self.ledger):
            if rec.get("action") == "verdict":
                return rec
        return None


def ledger_lost_problem(host: HostConfig, state: HostState) -> str:
    """'the ledger <root>/ledger.jsonl on HOST is missing; releases on disk: A (profile, created), B (live)'."""
    path = host.install_root / "ledger.jsonl"
    how = "is missing (deleted?)" if not state.ledger_exists else "is empty"
    return f"the ledger {path} on {host.name} {how}; releases on disk: {releases_on_disk(state)}"


def releases_on_disk(state: HostState) -> str:
    rels = sorted(state.releases.values(), key=lambda r: r.created_at, reverse=True)
    return ", ".join(f"{r.id} ({r.label}, {r.created_at or 'created ?'}" + (", live" if r.id == state.current else "")
                     + ")" for r in rels) or "none"


def read_state(conn: Connection, host: HostConfig) -> HostState:
    """What is live, what is staged, the ledger and the service, in one round trip."""
    root = str(host.install_root)
    current, manifests, (records, problems), service, exists = facts.gather(
        conn, facts.CurrentRelease(root), facts.ReleaseManifests(root), facts.LedgerRecords(root),
        facts.ServiceState(host.unit_name), facts.FileExists(f"{root}/ledger.jsonl"))
    return HostState(current=current, releases={rid: ReleaseInfo(rid, m) for rid, m in manifests.items()},
                     ledger=records, ledger_errors=problems, service=service, ledger_exists=exists)


LEDGER_APPEND = Path(__file__).resolve().parent.parent / "playbooks" / "files" / "opsctl-ledger-append"


def _ledger_append_source() -> str:
    return LEDGER_APPEND.read_text()


_ROLLOUT: contextvars.ContextVar[str | None] = contextvars.ContextVar("opsctl_rollout", default=None)


@contextlib.contextmanager
def ledger_rollout(rollout_id: str | None) -> Iterator[None]:
    """Every ledger record written inside names the rollout it belongs to."""
    token = _ROLLOUT.set(rollout_id)
    try:
        yield
    finally:
        _ROLLOUT.reset(token)


def append_ledger(conn: Connection, host: HostConfig, record: dict[str, Any]) -> dict:
    """One record, appended by the host-side appender (playbooks/files/opsctl-ledger-append,
    sent inline so it works before the first playbook ran): one write under an flock,
    fsynced, a torn last line moved aside first."""
    rollout = _ROLLOUT.get()
    rec = {"ts": now_iso(), "host": host.name, "who": who(), **({"rollout": rollout} if rollout else {}), **record}
    line = json.dumps(rec, sort_keys=False, default=str)
    res = conn.run(f"{host.host_python} -c {shlex.quote(_ledger_append_source())} "
                   f"{shlex.quote(str(host.install_root / 'ledger.jsonl'))}", stdin=line + "\n", check=False)
    if not res.ok:
        raise HostError(f"could not append to the ledger on {host.name}: "
                        f"{(res.stderr.strip().splitlines() or ['exit %d' % res.rc])[-1]}",
                        f"free space under {host.install_root} on the host, then run 'opsctl status'")
    return rec


def lock_command(root: str, holder: str) -> str:
    """The host command that holds the deploy lock while its stdin (the SSH channel) is open.
    The holder record (`holder`, a JSON object) gets the host-side pid of the shell that holds
    the flock (`host_pid`): a refusal checks it, so a record left by a holder that is gone is
    never reported as the holder; the record is removed when the lock is let go."""
    hf = shlex.quote(f"{root}/.lock.holder")
    inner = (f"trap 'rm -f {hf}' EXIT; trap 'exit 1' HUP INT TERM; "
             f"printf '%s, \"host_pid\": %s}}' {shlex.quote(holder[:-1])} $$ > {hf}; echo LOCKED; cat >/dev/null")
    return f"mkdir -p {shlex.quote(root)} && exec flock -n -E 75 {shlex.quote(f'{root}/.lock')} sh -c {shlex.quote(inner)}"


class HostLock:
    """flock on `<root>/.lock`, held by a long-running SSH command for as long as the
    deploy runs; it is released when the controller exits or dies (the channel closes)."""

    def __init__(self, conn: Connection, host: HostConfig, action: str):
        self.conn, self.host, self.action = conn, host, action
        self._channel = None

    def __enter__(self) -> "HostLock":
        if not isinstance(self.conn, SSHConnection):  # local connections: tests only
            return self
        root = self.host.install_root
        holder = json.dumps({"who": who(), "pid": os.getpid(), "action": self.action, "since": now_iso()})
        fab = self.conn._connection()
        transport = fab.client.get_transport()
        chan = transport.open_session()
        chan.exec_command(lock_command(str(root), holder))
        buf = b""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if chan.recv_ready():
                buf += chan.recv(1024)
                if b"LOCKED" in buf:
                    self._channel = chan
                    return self
            if chan.exit_status_ready():
                break
            time.sleep(0.02)
        rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
        chan.close()
        if rc == 75:
            desc = describe_holder(self.conn, self.host)
            raise LockHeldError(f"host {self.host.name} is locked by {desc}",
                                "wait for that run to finish ('opsctl status' shows progress), then try again")
        raise HostError(f"could not take the deploy lock on {self.host.name} (exit {rc})",
                        "check that flock (util-linux) is installed on the host")

    def __exit__(self, *exc) -> None:
        if self._channel is not None:
            try:
                self._channel.shutdown_write()
                self._channel.close()
            except Exception:  # noqa: BLE001 - the lock dies with the channel anyway
                pass
            self._channel = None


def describe_holder(conn: Connection, host: HostConfig) -> str:
    """Who holds the deploy lock, from `<root>/.lock.holder`, for a refusal. The record names
    the host-side process holding the flock (`host_pid`: the controller's shell, or the watch
    itself); a record whose process is gone is stale (its holder exited without clearing it,
    e.g. killed) and is never named as the holder (issue #32 item 12)."""
    hf = shlex.quote(str(host.install_root / ".lock.holder"))
    held = conn.run(f"cat {hf} 2>/dev/null", check=False).stdout.strip()
    try:
        info = json.loads(held)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        return "another opsctl run"
    pid = info.get("host_pid")
    if isinstance(pid, int) and pid > 0 and not conn.run(f"kill -0 {pid} 2>/dev/null", check=False).ok:
        return f"another opsctl run (the holder record names {info.get('who')}, whose process has exited: stale)"
    return f"{info.get('who')} (pid {info.get('pid')}, {info.get('action')} since {info.get('since')})"


def release_profile(info: ReleaseInfo | None, host: HostConfig) -> Profile:
    """The profile a release was built from (its manifest), else the inventory's."""
    if info is None:
        return host.profile(host.baseline_profile)
    data = info.manifest.get("profile", {})
    try:
        return Profile(**data)
    except Exception:  # noqa: BLE001 - an older manifest: fall back to the inventory's profile
        if info.budget_schedule:
            return host.profile(info.profile, budget_schedule=info.budget_schedule)
        return host.profile(info.profile, info.budget)
