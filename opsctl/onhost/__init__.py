"""What runs on the GPU host without opsctl: the load generator and the watch agent,
standard library only (the host's python3); the controller imports the same modules."""
from __future__ import annotations

from pathlib import Path

SOURCE = Path(__file__).resolve().parent
LOADGEN_PATH = SOURCE / "loadgen.py"
WATCH_AGENT_PATH = SOURCE / "watch_agent.py"
