"""Fleet waves cut as Ansible's `serial` cuts a play's hosts, checked against Ansible's own
documentation (no Ansible code is called: opsctl/flow/rollout.py implements the rule itself).

Source: docs.ansible.com, "Controlling playbook execution: strategies and more", section
"Setting the batch size with serial" (playbook_guide/playbooks_strategies.rst). Each example
below quotes the doc's sentence it checks.
"""
import ast
import inspect

import pytest

from opsctl.flow import rollout


def _hosts(n):
    return [f"h{i:02d}" for i in range(1, n + 1)]


def _sizes(n, serial):
    batches = rollout.serial_batches(_hosts(n), serial)
    assert [h for b in batches for h in b] == _hosts(n)      # every host once, in inventory order
    return [len(b) for b in batches]


def test_an_int_is_hosts_per_pass():
    # doc: "serial: 3 ... Ansible would complete the play on 3 hosts, then on 3 more hosts"
    # (6 hosts in the example)
    assert _sizes(6, 3) == [3, 3]
    # "If the number of hosts does not divide equally into the number of passes, the final pass
    # contains the remainder."
    assert _sizes(8, 3) == [3, 3, 2]


def test_a_percentage_of_all_hosts_rounded_down_the_final_pass_the_remainder():
    # doc: serial: "30%" ... "if you had 20 hosts in the webservers group, the first batch would
    # contain 6 hosts, the second batch would contain 6 hosts, the third batch would contain
    # 6 hosts, and the last batch would contain 2 hosts."
    assert _sizes(20, "30%") == [6, 6, 6, 2]
    # 30 % of 10 hosts is 3 per pass, the remainder last
    assert _sizes(10, "30%") == [3, 3, 3, 1]
    # rounded down: 25 % of 7 is 1.75 -> 1 per pass (not 2)
    assert _sizes(7, "25%") == [1] * 7
    # the percentage is of every host of the play, not of those left: 50 % of 5 is 2 each time
    assert _sizes(5, "50%") == [2, 2, 1]


def test_a_percentage_is_at_least_one_host():
    # doc: "No matter how small the percentage, the number of hosts per pass will always be 1
    # or greater."
    assert _sizes(3, "10%") == [1, 1, 1]
    assert _sizes(1, "1%") == [1]


def test_a_list_is_one_batch_per_entry_and_the_last_entry_repeats():
    # doc: serial: [1, 5, 10] ... "the first batch would contain a single host, the next would
    # contain 5 hosts, and (if there are any hosts left), every following batch would contain
    # either 10 hosts or all the remaining hosts, if fewer than 10 hosts remained."
    assert _sizes(30, [1, 5, 10]) == [1, 5, 10, 10, 4]
    assert _sizes(3, [1, 5, 10]) == [1, 2]
    assert _sizes(1, [1, 5, 10]) == [1]


def test_a_list_of_percentages():
    # doc: serial: ["10%", "20%", "100%"] ... "the first batch would contain 10% of the total
    # number of hosts, the second 20%, and the last batch would contain all the remaining hosts"
    # (of 20 hosts: 2, then 4, then the 14 left)
    assert _sizes(20, ["10%", "20%", "100%"]) == [2, 4, 14]


def test_a_list_mixing_counts_and_percentages():
    # doc: "You can also mix and match the values": serial: [1, 5, "20%"]
    # (of 20 hosts: 1, 5, then 20 % of all 20 = 4 per pass, repeating, the remainder last)
    assert _sizes(20, [1, 5, "20%"]) == [1, 5, 4, 4, 4, 2]
    # opsctl's default rollout [1, "25%", "100%"] on 8 hosts
    assert _sizes(8, [1, "25%", "100%"]) == [1, 2, 5]


def test_no_hosts_no_batches():
    assert rollout.serial_batches([], [1, "100%"]) == []


def test_no_private_ansible_api():
    # issue #53: the waves called PlaybookExecutor._get_serialized_batches on a stand-in object;
    # the next Ansible release could have broken it silently
    tree = ast.parse(inspect.getsource(rollout))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.split(".")[0] == "ansible"], imported
    assert "_get_serialized_batches" not in inspect.getsource(rollout)


@pytest.mark.parametrize("waves", [[1, "25%", "100%"], ["30%"], [2, "50%"]])
def test_plan_waves_put_the_canary_first_then_the_serial_batches(waves):
    from types import SimpleNamespace
    hosts = [SimpleNamespace(name=n) for n in _hosts(10)]
    policy = SimpleNamespace(canary=1, waves=waves)
    planned = rollout.plan_waves(hosts, policy)
    assert planned[0].name == "canary" and planned[0].hosts == ("h01",)
    assert [list(w.hosts) for w in planned[1:]] == rollout.serial_batches(_hosts(10)[1:], waves)
