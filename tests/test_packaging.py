"""The wheel `pip install .` builds carries the shipped configs, and they load from the installed package."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from conftest import REPO

SOURCES = ("convtts", "configs", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


def test_the_wheel_ships_the_configs_and_they_load(tmp_path):
    tree = tmp_path / "src"  # a copy: the build leaves build/ and egg-info behind
    tree.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, tree / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(tree), "-w", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("convtts-*.whl")
    shipped = sorted(f"convtts/configs/{p.name}" for p in (REPO / "configs").glob("*.yaml"))
    assert shipped and set(shipped) <= set(zipfile.ZipFile(wheel).namelist())

    zipfile.ZipFile(wheel).extractall(tmp_path / "installed")
    probe = (
        "from convtts.config import load_config, shipped_config; "
        "print(shipped_config('default')); print(load_config('default').text.max_words)"
    )
    installed = {"PYTHONPATH": str(tmp_path / "installed")}  # ahead of any convtts the interpreter has
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=installed, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == [str(tmp_path / "installed" / "convtts" / "configs" / "default.yaml"), "30"]
    printed = subprocess.run(
        [sys.executable, "-m", "convtts.config", "default"], cwd=tmp_path, env=installed, capture_output=True, text=True
    )
    assert printed.stdout == (REPO / "configs" / "default.yaml").read_text()
