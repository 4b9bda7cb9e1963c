"""The runtime half of autoopt: `optimize()` and its passes."""

from autoopt.runtime import moved

moved.install()  # the module paths from before the regrouping, for one release
