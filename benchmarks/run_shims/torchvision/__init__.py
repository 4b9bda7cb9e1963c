"""A stand-in for torchvision in benchmarks/run_scripts.py: tiny synthetic datasets, the common
transforms, small models with torchvision's attribute names. Never used outside that harness."""

from . import datasets, models, transforms, utils

__version__ = "0.0-autoopt-run-shim"
__all__ = ["datasets", "models", "transforms", "utils"]
