"""opsctl's host checks: a testinfra suite (test_pre.py, test_post.py) and its runner.

Run them with `opsctl check pre|post|all -i INVENTORY`, from Python with
`opsctl.checks.runner.run_checks(inventory, group)`, or with plain pytest:

    pytest -p opsctl.checks.plugin --pyargs opsctl.checks --inventory inventories/lab

See docs/checks.md.
"""
