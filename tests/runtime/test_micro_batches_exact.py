"""`choose_parts` at its boundaries (each case kills a mutant that survived `make mutation`;
docs/benchmarks/mutation.md). The property throughout: the fewest parts whose largest one fits
the budget by the fit `fixed + per_row * rows`."""

from __future__ import annotations

import pytest

from autoopt.runtime.accumulation.micro_batches import choose_parts

STATE = 100


@pytest.mark.parametrize(
    ("rows", "saved_one", "saved_two", "over_state", "parts"),
    [
        (
            8,
            15,
            20,
            50,
            1,
        ),  # fixed 10 + 5 x 8 = 50 = the budget over the state exactly: one part (>= not >)
        (8, 4, 8, 32, 1),  # fixed 0 (not clamped up to 1): 4 x 8 = 32 fits exactly
        (8, 2, 3, 5, 2),  # 1 byte per row, 4 left after fixed 1: 4 rows per part
        (9, 4, 8, 10, 5),  # 2 rows fit (10 // 4, not 2.5): 5 parts, not 4 parts of 3 rows
        (8, 10, 10, -5, 1),  # nothing grows with the rows: one part even over the budget
        (8, 20, 18, 5, 1),  # 2 rows measured smaller than 1 (noise): per row 0, not 1
    ],
)
def test_the_fewest_parts_whose_largest_fits(
    rows: int, saved_one: int, saved_two: int, over_state: int, parts: int
) -> None:
    choice = choose_parts(rows, STATE, saved_one, saved_two, STATE + over_state)
    assert choice.parts == parts, choice
    if choice.per_row and choice.parts > 1:
        assert choice.step_bytes <= choice.budget  # the largest part fits
        one_more = choice.state + choice.fixed + choice.per_row * (choice.part_rows + 1)
        assert one_more > choice.budget or choice.parts == rows  # and no bigger part would


def test_the_report_line_keeps_its_figures_when_even_one_row_exceeds() -> None:
    line = choose_parts(64, STATE, 13, 16, 105).render()
    assert line.startswith("step 113 B for a budget of 105 B (state 100 B + saved activations")
    assert line.endswith("; still exceeds the budget by 8 B at 1 sample")
