"""The result type shared by validation, host checks and gates."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Finding(BaseModel):
    """One check's outcome: `ok`, and when not ok a one-line diagnosis and fix. A `warning` that is
    not ok is reported and recorded but fails no gate by itself (`failed`)."""

    check: str
    ok: bool
    diagnosis: str = ""
    fix: str = ""
    details: dict = Field(default_factory=dict)
    severity: Literal["error", "warning"] = "error"

    @property
    def failed(self) -> bool:
        """Not ok, and an error: what stops a deploy."""
        return not self.ok and self.severity == "error"

    @property
    def warned(self) -> bool:
        return not self.ok and self.severity == "warning"

    def one_line(self) -> str:
        if self.ok:
            return f"ok   {self.check}" + (f": {self.diagnosis}" if self.diagnosis else "")
        line = f"{'WARN' if self.warned else 'FAIL'} {self.check}: {self.diagnosis}"
        return line + (f" (fix: {self.fix})" if self.fix else "")
