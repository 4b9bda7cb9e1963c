"""The lint engine of autoopt: lint, rewrite and `--wrap` over libcst.

tree/     reading and editing libcst trees
program/  the model of the user's program that every rule asks
engine/   running rules over files (the rule contract: `engine.rule`)
rewrite/  fixes, each verified before it is written
wrap/     inserting the one `autoopt.optimize()` call
"""

from autoopt.moved import redirect

# Where each module of the flat layout went (stop 20); rules written against the old paths keep
# working for a release, with a DeprecationWarning naming the new one. (The old `engine`,
# `rewrite` and `wrap` modules are now the packages of those names: `engine.analysis`,
# `rewrite.apply`, `wrap.insert`.)
redirect(
    {
        "autoopt.lint.nodes": "autoopt.lint.tree.nodes",
        "autoopt.lint.metadata": "autoopt.lint.tree.metadata",
        "autoopt.lint.calls": "autoopt.lint.tree.calls",
        "autoopt.lint.edits": "autoopt.lint.tree.edits",
        "autoopt.lint.notebook": "autoopt.lint.tree.notebook",
        "autoopt.lint.encoding": "autoopt.lint.tree.encoding",
        "autoopt.lint.facts": "autoopt.lint.program.facts",
        "autoopt.lint.device": "autoopt.lint.program.device",
        "autoopt.lint.precision": "autoopt.lint.program.precision",
        "autoopt.lint.handled": "autoopt.lint.program.handled",
        "autoopt.lint.trained_models": "autoopt.lint.program.trained_models",
        "autoopt.lint.placement": "autoopt.lint.program.placement",
        "autoopt.lint.conv_models": "autoopt.lint.program.conv_models",
        "autoopt.lint.modules": "autoopt.lint.program.modules",
        "autoopt.lint.loops": "autoopt.lint.program.loops",
        "autoopt.lint.torch_api": "autoopt.lint.program.torch_api",
        "autoopt.lint.amp_api": "autoopt.lint.program.amp_api",
        "autoopt.lint.project_facts": "autoopt.lint.program.project_facts",
        "autoopt.lint.rule": "autoopt.lint.engine.rule",
        "autoopt.lint.registry": "autoopt.lint.engine.registry",
        "autoopt.lint.runner": "autoopt.lint.engine.runner",
        "autoopt.lint.config": "autoopt.lint.engine.config",
        "autoopt.lint.discovery": "autoopt.lint.engine.discovery",
        "autoopt.lint.cache": "autoopt.lint.engine.cache",
        "autoopt.lint.results": "autoopt.lint.engine.results",
        "autoopt.lint.suppress": "autoopt.lint.engine.suppress",
        "autoopt.lint.project": "autoopt.lint.engine.project",
        "autoopt.lint.explain": "autoopt.lint.engine.explain",
        "autoopt.lint.verify": "autoopt.lint.rewrite.verify",
        "autoopt.lint.bound_names": "autoopt.lint.rewrite.bound_names",
        "autoopt.lint.fixes": "autoopt.lint.rewrite.fixes",
        "autoopt.lint.fixes.autocast": "autoopt.lint.rewrite.fixes.autocast",
        "autoopt.lint.fixes.preconditions": "autoopt.lint.rewrite.fixes.preconditions",
        "autoopt.lint.wrap_plan": "autoopt.lint.wrap.plan",
        "autoopt.lint.wrap_code": "autoopt.lint.wrap.codebase",
        "autoopt.lint.wrap_tree": "autoopt.lint.wrap.tree",
    }
)
