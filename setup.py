"""Installs `sparkbeam_site.pth` into the site directory, beside the packages.

pyproject.toml holds the project's metadata; this file only adds the .pth, which setuptools'
configuration cannot place at the root of the site directory: a wheel gets it from `build_py`,
an editable install (`make install`: `editable_mode=compat`) from `editable_wheel`. What the
.pth does and why: `sparkbeam_site.py`.
"""
from __future__ import annotations

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "sparkbeam_site.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class EditableWheelWithPth(editable_wheel):
    # An editable wheel holds only the .pth that points at the checkout (build_py's output is
    # thrown away) plus what is written into the unpacked wheel: the .pth goes there, from
    # setuptools' private step below. A setuptools without it fails the install, loudly.
    def run(self) -> None:
        if not hasattr(editable_wheel, "_run_build_commands"):
            raise RuntimeError("this setuptools' editable_wheel has no _run_build_commands: "
                               "setup.py cannot add sparkbeam_site.pth to an editable install")
        super().run()

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # type: ignore[no-untyped-def]
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copy(os.path.join(HERE, PTH), os.path.join(unpacked_wheel, PTH))
        return result


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
