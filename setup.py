"""What pyproject.toml cannot say: the image recipes and examples travel inside the wheel.

They live at the repository root (images/, examples/) and are installed as `runner/_assets/images`
and `runner/_assets/examples`, where `runner.images.repo_root()` finds them when cko runs from an
installed wheel, outside any checkout. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

ASSETS = {"runner._assets.images": "images", "runner._assets.examples": "examples"}

setup(
    packages=find_packages(include=["runner*", "operations*", "knowledge*"]) + list(ASSETS),
    package_dir=ASSETS,
    package_data={
        "knowledge": ["cards/*.yaml"],
        "operations": ["evidence/native/*.c"],
        **{name: ["**/*"] for name in ASSETS},
    },
    exclude_package_data={name: ["**/__pycache__/*", "**/*.pyc", "**/build/*", "**/.build/*"] for name in ASSETS},
)
