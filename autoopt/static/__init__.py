"""The static half of autoopt: the lint/rewrite engine over libcst, and the rule contract."""
