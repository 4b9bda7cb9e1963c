"""The runtime half of autoopt: `optimize()` and its passes."""
