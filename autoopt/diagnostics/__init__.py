"""Diagnostics: `autoopt doctor` (machine report) and `autoopt bench` (benchmark harness)."""
