"""`python3 opsctl-onhost.pyz {watch|loadgen|metrics} ARGS` (or `python -m opsctl.onhost ...`): the
host-side programs of one archive."""
from __future__ import annotations

import sys

USAGE = "usage: opsctl-onhost.pyz {watch|loadgen|metrics} ARGS (watch --help, loadgen --help, metrics --help)"


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    program = args.pop(0) if args else ""
    # imported on demand: the watch runs for months and need not hold the load generator's modules
    if program == "watch":
        from . import watch_agent

        return watch_agent.main(args)
    if program == "loadgen":
        from . import loadgen

        return loadgen.main(args)
    if program == "metrics":
        from . import metrics

        return metrics.main(args)
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
