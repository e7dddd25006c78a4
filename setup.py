"""What pyproject.toml cannot say: one import namespace, and the assets that travel in the wheel.

The code lives in the repository's top-level folders runner/, operations/ and knowledge/; the wheel
installs them as `cko_perf.runner`, `cko_perf.operations` and `cko_perf.knowledge` (package_dir maps
each to its folder, subpackages included; cko_perf/'s symlinks serve the checkout only), so the
wheel adds one top-level name, `cko_perf`, to site-packages. The image recipes and examples
(images/, examples/) are installed as `cko_perf/runner/_assets/images` and `.../examples`, where
`runner.images.repo_root()` finds them when cko runs from an installed wheel, outside any checkout.
Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = ("runner", "operations", "knowledge")
ASSETS = {"cko_perf.runner._assets.images": "images", "cko_perf.runner._assets.examples": "examples"}
CODE = {"cko_perf": "cko_perf"} | {f"cko_perf.{folder}": folder for folder in FOLDERS}
SUBPACKAGES = [f"cko_perf.{folder}.{sub}" for folder in FOLDERS for sub in find_packages(where=folder)]

setup(
    packages=[*CODE, *SUBPACKAGES, *ASSETS],
    package_dir=CODE | ASSETS,
    package_data={
        "cko_perf.knowledge": ["cards/*.yaml"],
        "cko_perf.operations": ["evidence/native/*.c"],
        **{name: ["**/*"] for name in ASSETS},
    },
    exclude_package_data={name: ["**/__pycache__/*", "**/*.pyc", "**/build/*", "**/.build/*"] for name in ASSETS},
)
