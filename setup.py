"""The wheel carries configs/*.yaml as convtts/configs/, so that `pip install .` users get the shipped configs.

Everything else is in pyproject.toml; setuptools cannot name files outside the package as package data.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithConfigs(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "convtts" / "configs"
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(Path(__file__).parent.joinpath("configs").glob("*.yaml")):
            self.copy_file(str(path), str(target / path.name))


setup(cmdclass={"build_py": BuildWithConfigs})
