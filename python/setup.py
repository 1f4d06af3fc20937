"""The build of `pip install ./python` (pyproject.toml): the extension as
the repository builds it, `make build/libuvccl.a`, then
tools/torch-ext.sh against the torch of the python running pip (its
headers, C++ ABI and standard, CUDA where it has it), libuvccl linked in
statically; the result goes where setuptools puts uvccl_torch._C. Built in
place (pip builds a local directory in place): the repository is the
parent of this folder."""
import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def version():
    with open(os.path.join(ROOT, "include", "uvccl.h")) as f:
        return re.search(r'#define UVCCL_VERSION_STRING "([^"]+)"',
                         f.read()).group(1)


class BuildWithRepository(build_ext):
    def build_extension(self, ext):
        if not os.path.exists(os.path.join(ROOT, "tools", "torch-ext.sh")):
            sys.exit("uvccl-torch: build from the uvccl repository "
                     "(pip install ./python in its root)")
        # -o deps: installing system packages is not pip's business; a
        # missing header fails the build with the compiler's message
        subprocess.check_call(["make", "-o", "deps", "build/libuvccl.a"],
                              cwd=ROOT)
        subprocess.check_call([os.path.join(ROOT, "tools", "torch-ext.sh")],
                              cwd=ROOT,
                              env=dict(os.environ, PYTHON=sys.executable))
        built = os.path.join(HERE, "uvccl_torch",
                             "_C" + sysconfig.get_config_var("EXT_SUFFIX"))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)


setup(version=version(),
      ext_modules=[Extension("uvccl_torch._C", sources=[])],
      cmdclass={"build_ext": BuildWithRepository})
