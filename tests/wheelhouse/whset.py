"""The small real wheelhouse the tests build (see conftest.py)."""
REQUIREMENTS = ["six==1.16.0", "attrs==24.2.0", "markupsafe==2.1.5"]
PYTHON = "3.11"
PLATFORM = "manylinux_2_34_x86_64"
