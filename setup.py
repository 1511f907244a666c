"""Build the optional C engine with cffi; everything else is in pyproject.toml.

The extension is marked optional: without a compiler the install still
succeeds and dataplane.engine logs once that it runs the Python engine.
"""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["dataplane", "dataplane.*"]),
    cffi_modules=["csrc/build_ffi.py:ffi"],
)
