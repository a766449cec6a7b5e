"""setuptools entry point for those whose habit is `python setup.py develop` / `bdist_wheel` /
`build_ext --inplace`.

It runs the same CMake build as `pip install --no-build-isolation .` (scikit-build-core, the build
backend pyproject.toml names): the same CMakeLists.txt, the same build folder build/<wheel tag>/
(so either way rebuilds only what changed), the build type and CMake definitions read from
pyproject.toml's [tool.scikit-build] table, and the project's metadata from its [project] table.
Build against the torch already installed; nothing here downloads one.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def scikit_build_settings():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        table = tomllib.load(f)["tool"]["scikit-build"]
    return table.get("cmake", {}).get("build-type", "Release"), table.get("cmake", {}).get(
        "define", {})


def wheel_tag():
    tag = "cp%d%d" % sys.version_info[:2]
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{tag}-{tag}-{platform}"


class CMakeBuild(build_ext):
    """Builds framejit._C with CMake in build/<wheel tag>/ and puts it where setuptools wants it."""

    def build_extension(self, ext):
        build_type, defines = scikit_build_settings()
        build_dir = os.path.join(ROOT, "build", wheel_tag())
        configure = ["cmake", "-S", ROOT, "-B", build_dir, f"-DCMAKE_BUILD_TYPE={build_type}",
                     f"-DPython_EXECUTABLE={sys.executable}"]
        configure += [f"-D{name}={value}" for name, value in defines.items()]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_C", "-j", jobs])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(build_dir, "_C" + suffix)
        if not os.path.exists(built):
            raise RuntimeError(f"framejit: the CMake build left no {built}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built, target)


setup(
    package_dir={"": "python"},
    packages=["framejit", "framejit._cuda"],
    ext_modules=[Extension("framejit._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
