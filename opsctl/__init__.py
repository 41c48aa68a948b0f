"""opsctl: put speculative-decoding SGLang releases live on one GPU host, safely."""
# The one copy of opsctl's version: pyproject.toml reads it (dynamic = ["version"]), `opsctl
# --version` prints it, every release's manifest.json and ledger records carry it. One per
# wave of merges; CHANGELOG.md has a section for each.
__version__ = "0.7.0"
