"""The lint engine of autoopt: lint and rewrite over libcst, and the rule contract."""
