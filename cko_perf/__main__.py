"""`python -m cko_perf`: the `cko` command, where no console script is installed."""

from .runner.cli import main

main()
