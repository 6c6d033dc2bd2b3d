"""Package discovery; every other setting lives in pyproject.toml.

Every folder with an ``__init__.py`` under zerogr_core/ ships, and kernels/ ships with its
subpackages under the name ``zerogr_kernels`` (pyproject.toml maps that name to the folder).
setuptools' discovery in pyproject.toml finds packages by folder name and cannot rename one.
"""
from setuptools import find_packages, setup

_KERNELS = ["zerogr_kernels" + name[len("kernels"):] for name in find_packages(include=["kernels", "kernels.*"])]

setup(packages=find_packages(include=["zerogr_core", "zerogr_core.*"]) + _KERNELS)
