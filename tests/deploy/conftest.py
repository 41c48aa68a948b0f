"""The drain is a no-op in this directory's unit tests (tests/drainstub.py); `truth_lab`, the module
fixture of the rollback-truth lab modules (test_truth_*_lab.py)."""
import shutil

import pytest

from drainstub import no_drain  # noqa: F401  (autouse)
from truthlab import live


@pytest.fixture(scope="module")
def truth_lab(clean_lab, baselined, tmp_path_factory):
    """ar-tp8 judged and live, its baseline stored; an inventory with a short guard."""
    inv = tmp_path_factory.mktemp("inv") / "inv"
    shutil.copytree(clean_lab.inventory_dir, inv)
    gv = inv / "group_vars/all.yml"
    gv.write_text(gv.read_text().replace("  keep_releases: 5", "  keep_releases: 8\n  guard_s: 15"))
    baselined.restore(clean_lab)
    clean_lab.inv = inv
    clean_lab.baseline = live(clean_lab)["current"]
    return clean_lab
