"""Releases on a host: ids, what is live and what the ledger says about them (the ledger
itself is opsctl/ledger.py, the deploy lock opsctl/lock.py).

A release id is content-addressed (profile slug + digest of rendered files and
shipped artifacts), so deploying the same thing twice names the same release and
changes nothing.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterable

from opsctl.config import HostConfig, Profile
from opsctl.host import facts
from opsctl.host.connection import Connection

NO_GATE_REASON = "gates skipped (--no-gate)"  # the reason of a --no-gate deploy's promote record


def ungated(rec: dict) -> bool:
    """A promote record of a deploy that ran no gate (--no-gate): `gated: false`, or the reason
    older opsctl versions wrote."""
    return rec.get("gated") is False or rec.get("reason") == NO_GATE_REASON


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
        even while it serves after `rollback --to RELEASE --force`; nor is one that never
        passed a gate (a --no-gate deploy's, a tune's trial release: issue #50)."""
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
                    and rel not in out and self.gate_failed(rel) is None and self.passed_gate(rel):
                out.append(rel)
        return out

    def passed_gate(self, release: str | None) -> bool:
        """Did a gate ever pass `release`: a promote record of it from a deploy (or `tune --apply`)
        that ran its gates? A --no-gate deploy's promote, a trial (opsctl tune) and a rollback
        to it are no verdict: such a release was never judged (issue #50)."""
        return bool(release) and any(
            rec.get("action") == "promote" and rec.get("result") == "ok" and rec.get("to_release") == release
            and not rec.get("forced") and not ungated(rec) for rec in self.ledger)

    def never_judged_why(self, release: str) -> str:
        """Why `release` has no passing gate, in words: 'deployed with --no-gate', 'a trial
        release of opsctl tune' or 'its deploy never passed a gate'."""
        info = self.releases.get(release)
        if any(rec.get("action") == "promote" and rec.get("to_release") == release and ungated(rec)
               for rec in self.ledger):
            return "deployed with --no-gate"
        if (info is not None and info.trial_set) or any(
                rec.get("trial") and rec.get("to_release") == release for rec in self.ledger):
            return "a trial release of opsctl tune"
        for rec in reversed(self.ledger):
            if rec.get("to_release") == release and rec.get("action") in ("promote", "rollback", "deploy"):
                if rec.get("action") == "deploy" and rec.get("result") in ("started", "interrupted"):
                    return "its deploy was interrupted or killed"
                break
        return "its deploy never passed a gate"

    def served_ungated(self, release: str) -> bool:
        """The newest record that switched to `release` is a --no-gate deploy's promote: what a
        --no-gate deploy of the same release again leaves unchanged (no restart)."""
        for rec in reversed(self.ledger):
            if rec.get("to_release") != release or rec.get("switched") is False:
                continue
            if rec.get("action") in ("promote", "rollback") or (rec.get("action") == "deploy"
                                                                and rec.get("result") in ("started", "interrupted")):
                return rec.get("action") == "promote" and rec.get("result") == "ok" and ungated(rec)
        return False

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
        back by a rollback), and did a gate ever pass it (passed_gate)? A deploy that started
        or was interrupted after it did not; a --no-gate or trial release never was."""
        for rec in reversed(self.ledger):
            if rec.get("to_release") != release or rec.get("switched") is False:
                continue  # (a record that never switched to it says nothing about it)
            if rec.get("action") in ("promote", "rollback"):
                return (rec.get("result") == "ok" and not rec.get("forced") and self.gate_failed(release) is None
                        and self.passed_gate(release))
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
        controller died): started/interrupted with no promote/rollback after it, and no switch
        (recorded on the host by bin/opsctl-switch) away from its release: a controller killed
        during its rollback left the rollback's switch on record, not an unfinished deploy."""
        away: set = set()   # releases a later switch left
        for rec in reversed(self.ledger):
            act, res = rec.get("action"), rec.get("result")
            if act in ("promote", "rollback"):
                return None
            if act == "switch" and rec.get("from_release") and rec.get("from_release") != rec.get("to_release"):
                away.add(rec["from_release"])
            if act == "deploy" and res in ("started", "interrupted") and rec.get("to_release") in away:
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
