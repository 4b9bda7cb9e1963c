"""Package discovery; everything else is in pyproject.toml.

rules/ lives at the top of the repository but ships as ``autoopt.rules`` (wheel and editable
install alike). setuptools' declarative ``packages.find`` cannot rename a folder, so the package
list is discovered here: every package under ``autoopt/`` plus ``rules/`` as ``autoopt.rules``.
A new module or sub-package is picked up without editing a list.
"""

from setuptools import find_packages, setup

RULES = "autoopt.rules"
packages = find_packages(include=["autoopt", "autoopt.*"])
packages += [RULES] + [f"{RULES}.{name}" for name in find_packages("rules")]

setup(packages=packages, package_dir={RULES: "rules"})
