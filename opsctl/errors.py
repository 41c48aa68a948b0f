"""Domain errors. Every failure a user can hit is one of these; the CLI maps
them to a one-line message and an exit code in one place (opsctl/cli)."""
from __future__ import annotations


class OpsctlError(Exception):
    """A failure with a one-line diagnosis and, where known, the fix."""

    exit_code = 1

    def __init__(self, problem: str, fix: str | None = None, *, details: dict | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        self.details = details or {}

    def one_line(self) -> str:
        text = " ".join(self.problem.split())
        if self.fix:
            text += f" (fix: {' '.join(self.fix.split())})"
        return text

    def as_dict(self) -> dict:
        return {"error": type(self).__name__, "problem": self.problem, "fix": self.fix,
                "exit_code": self.exit_code, **({"details": self.details} if self.details else {})}


class ConfigError(OpsctlError):
    """Bad input: inventory, profile, flags, missing local files. Nothing was touched."""
    exit_code = 2


class HostError(OpsctlError):
    """The host could not be reached, or a command on it failed."""
    exit_code = 3


class LockHeldError(OpsctlError):
    """Another deploy/rollback holds the host's lock."""
    exit_code = 4


class DeployFailed(OpsctlError):
    """The new release failed a step (start, validation, gate); the host was rolled back."""
    exit_code = 5


class CheckFailed(OpsctlError):
    """A host check, validation or gate reported failures (no rollback involved)."""
    exit_code = 6


class LabError(OpsctlError):
    """The local lab host could not be booted or torn down."""
    exit_code = 7
