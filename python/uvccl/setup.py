"""The build of `pip install ./python/uvccl` (pyproject.toml): this folder is
the package itself (so PYTHONPATH=python imports it from the repository
after `make`); its extension is _core.c (with op.c, group.c, store.c) compiled against the python that
runs pip, with the repository's libuvccl.a (`make build/libuvccl.a` in the
repository root) linked in and Debian's libuv, OpenSSL dynamically."""
import os
import re
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STATIC = os.path.join(ROOT, "build", "libuvccl.a")


def version():
    with open(os.path.join(ROOT, "include", "uvccl.h")) as f:
        return re.search(r'#define UVCCL_VERSION_STRING "([^"]+)"',
                         f.read()).group(1)


class BuildWithRepository(build_ext):
    def run(self):
        # -o deps: installing system packages is not pip's business. The
        # plain build whatever make runs pip (a sanitizer build's flags
        # reach sub-makes through MAKEFLAGS).
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "SANITIZE")}
        subprocess.check_call(["make", "-o", "deps", "build/libuvccl.a"],
                              cwd=ROOT, env=env)
        super().run()


class PackageOnly(build_py):
    # the package folder holds this script too: not a module of it
    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir)
                if m[1] != "setup"]


setup(
    name="uvccl",
    version=version(),
    description="uvccl's collectives and store on asyncio's own loop",
    packages=["uvccl"],
    package_dir={"uvccl": "."},
    package_data={"uvccl": ["py.typed", "*.pyi"]},
    ext_modules=[Extension(
        "uvccl._core", sources=["_core.c", "op.c", "group.c", "store.c"],
        depends=["core.h"],
        include_dirs=[os.path.join(ROOT, "include")],
        extra_objects=[STATIC],
        libraries=["uv", "ssl", "crypto", "dl", "m"],
        extra_compile_args=["-std=gnu11", "-fvisibility=hidden",
                            "-Wno-missing-field-initializers"],
    )],
    cmdclass={"build_ext": BuildWithRepository, "build_py": PackageOnly},
)
