"""cko's one import namespace: `cko_perf.runner`, `cko_perf.operations`, `cko_perf.knowledge`.

The code lives in the repository's top-level folders runner/, operations/ and knowledge/; the
names `runner`, `operations` and `knowledge` are common, so the installed wheel holds only this
package. Here in the checkout the three subpackages are symlinks to those folders (with the
repository root on sys.path, `import cko_perf.runner.cli` works without an install); the wheel maps
them to the same folders through setup.py's package_dir, so it holds real files, not links.

Inside an operation image the supervisor is still the top-level `operations` (/opt/cko/src):
drivers import `from operations.driver import main` there. Host code never imports a top-level
`runner`, `operations` or `knowledge` (tests/test_shape.py holds that).
"""
