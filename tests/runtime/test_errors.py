"""error_summary: one line per exception, the real error kept for dynamo-style wrappers."""

from __future__ import annotations

from autoopt.runtime.errors import error_summary


def test_first_line_with_the_type() -> None:
    err = ValueError("shapes differ\n  at line 3\n  more context")
    assert error_summary(err) == "ValueError: shapes differ"
    assert error_summary(KeyError()) == "KeyError"


def test_wrapper_errors_keep_the_line_naming_the_real_error() -> None:
    err = RuntimeError("backend='inductor' raised:\nCompilationError: no C compiler\nstack...")
    assert error_summary(err) == (
        "RuntimeError: backend='inductor' raised: CompilationError: no C compiler"
    )


def test_long_messages_are_cut() -> None:
    text = error_summary(RuntimeError("x" * 1000), limit=40)
    assert len(text) == 40 and text.endswith("...") and text.startswith("RuntimeError: xxx")
