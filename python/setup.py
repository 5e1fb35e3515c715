"""pip install --no-build-isolation ./python  (after `cmake --build build --target _atoll`).

Installs the package CMake assembled in <build>/python/atoll (the compiled _atoll module and the
Python layer). ATOLL_BUILD_DIR names the build folder (default: ../build next to this file).
"""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("ATOLL_BUILD_DIR", os.path.join(HERE, "..", "build"))


class CopyBuilt(build_py):
    """Copies the compiled module next to the package sources."""

    def run(self):
        built = glob.glob(os.path.join(BUILD, "python", "atoll", "_atoll*.so"))
        if not built:
            raise SystemExit("no _atoll*.so in %s/python/atoll: build it first "
                             "(cmake --build build --target _atoll) or set ATOLL_BUILD_DIR" % BUILD)
        super().run()
        target = os.path.join(self.build_lib, "atoll")
        os.makedirs(target, exist_ok=True)
        shutil.copy2(built[0], target)


setup(
    name="atoll",
    version="0.1.0",
    description="Learners of a Decoupled DiLoCo run (atoll) from PyTorch or numpy",
    packages=["atoll"],
    package_data={"atoll": ["py.typed", "__init__.pyi"]},
    cmdclass={"build_py": CopyBuilt},
    python_requires=">=3.9",
    install_requires=["numpy"],
)
