"""The result type shared by validation, host checks and gates."""
from __future__ import annotations

from pydantic import BaseModel, Field


class Finding(BaseModel):
    """One check's outcome: `ok`, and when not ok a one-line diagnosis and fix."""

    check: str
    ok: bool
    diagnosis: str = ""
    fix: str = ""
    details: dict = Field(default_factory=dict)

    def one_line(self) -> str:
        if self.ok:
            return f"ok   {self.check}" + (f": {self.diagnosis}" if self.diagnosis else "")
        line = f"FAIL {self.check}: {self.diagnosis}"
        return line + (f" (fix: {self.fix})" if self.fix else "")
