"""Code that runs inside the container (`python -I -m operations OP ...`): one module per
operation under `operations.ops`, the workload-driver helper, statistics and parsers.
It must import nothing from `runner` (the host controller is not in the image)."""

__version__ = "0.1.0"
