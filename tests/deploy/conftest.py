"""The drain is a no-op in this directory's unit tests (tests/drainstub.py)."""
from drainstub import no_drain  # noqa: F401  (autouse)
