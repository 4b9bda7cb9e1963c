"""autoopt's rule catalog: one module per rule, each defining one `autoopt.lint.engine.rule.Rule`.

This folder sits at the top of the repository and is installed as the package `autoopt.rules`."""
