"""opsctl lab emulator of SGLang 0.5.23 (distribution `sglang`, version 0.5.23+lab).

NOT SGLang. A stdlib-only stand-in that the lab host runs in place of the real
server: same command line (`python -m sglang.launch_server ...`), same log
lines, same HTTP endpoints, a performance model of the site instead of GPUs.
See docs/lab.md in the opsctl repository.
"""
__version__ = "0.5.23"
EMULATOR = True
