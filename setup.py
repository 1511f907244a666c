"""Build the optional C engine with cffi, and ship the engine contract's header;
everything else is in pyproject.toml.

The extension is marked optional: without a compiler the install still
succeeds and dataplane.engine logs once that it runs the Python engine.
"""
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HEADER = os.path.join("csrc", "dataplane.h")
HEADER_IN_PACKAGE = os.path.join("dataplane", "engine", "dataplane.h")


class build_py_with_header(build_py):
    """Copies csrc/dataplane.h into the built package: dataplane/engine/contract.py
    reads the engine's facts from it at import, and an installed package has no
    csrc/. In the checkout contract.py reads csrc/dataplane.h itself, so the
    header has one source and no copy in the tree."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, HEADER_IN_PACKAGE)
        self.mkpath(os.path.dirname(target))
        self.copy_file(HEADER, target, preserve_mode=False)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [
            os.path.join(self.build_lib, HEADER_IN_PACKAGE)]


setup(
    packages=find_packages(include=["dataplane", "dataplane.*"]),
    cffi_modules=["csrc/build_ffi.py:ffi"],
    cmdclass={"build_py": build_py_with_header},
)
