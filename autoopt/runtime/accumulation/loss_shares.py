"""What share of a batch's loss each micro-batch carries under `accumulate="auto"`: the loss's
normaliser, told apart on probe rows of the first batch.

The losses users write are a sum of per-sample terms over a normaliser D: the samples (a
mean-reduced `mse_loss`), the labelled tokens (`cross_entropy(..., ignore_index=-100)`, HF
`labels`, whose causal LM heads shift them by one inside the model), a mask's sum, or nothing (a
sum). A part p of a batch B computes sum_p / D(p); seeding its backward with D(p) / D(B) rebuilds
the full batch's gradient exactly. autoopt does not see the loss, so it measures which D it is:
the gradient reaching the model's per-sample outputs for row a is proportional to 1 / D of the
rows it ran with, so its ratio between the pair (a, b) and a alone is D({a}) / D({a, b}).
`candidates` lists the normalisers a batch offers (samples, a sum, for each integer tensor of
the batch with a sequence dimension: its entries != -100 and, for a 0/1 mask, its ones, each whole
and from the second position), `pick_pair` the two rows that tell most of them apart, and
`matching` those whose predicted ratios the measured ones equal.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

IGNORE_INDEX = -100  # what cross_entropy and HF losses leave out by default
RATIO_TOLERANCE = 0.02  # measured vs predicted ratio (the outputs of 1 and 2 rows differ by
# float rounding; the candidates to tell apart differ by far more, or are refused as ambiguous)
_PAIR_ROWS = 16  # probe pairs are searched among the first rows of the batch


@dataclass(frozen=True)
class Normaliser:
    """One way a loss may be normalised: by the samples, not at all (a sum), or by a count of
    entries of one tensor of the batch (`path` into it), leaving out the first `shift` positions
    of its second dimension."""

    kind: str  # "samples" | "sum" | "labels" (entries != -100) | "mask" (entries != 0)
    path: tuple[Any, ...] = ()
    shift: int = 0

    def describe(self) -> str:
        """For the report."""
        if self.kind in ("samples", "sum"):
            return "the samples" if self.kind == "samples" else "a sum (no normaliser)"
        where = "batch" + "".join(f"[{p!r}]" for p in self.path)
        cut = f"[:, {self.shift}:]" if self.shift else ""
        test = f"!= {IGNORE_INDEX}" if self.kind == "labels" else "!= 0"
        return f"the entries of {where}{cut} {test}"

    def per_row(self, batch: Any) -> torch.Tensor | None:
        """Each row's part of D (float64, on the CPU); None for a sum (no normaliser)."""
        if self.kind == "sum":
            return None
        if self.kind == "samples":
            return torch.ones(_rows_of(batch), dtype=torch.float64)
        t = _at(batch, self.path)[:, self.shift :]
        counted = t != IGNORE_INDEX if self.kind == "labels" else t != 0
        return counted.reshape(t.shape[0], -1).sum(1).to("cpu", torch.float64)

    def shares(self, batch: Any, sizes: list[int]) -> list[tuple[int, int]]:
        """The seed (numerator, denominator) of each consecutive part of `sizes` rows."""
        counts = self.per_row(batch)
        if counts is None:
            return [(1, 1)] * len(sizes)
        whole = int(counts.sum())
        if whole == 0:  # nothing counted: the full batch's loss is 0/0 too; keep row shares
            return [(size, sum(sizes)) for size in sizes]
        out, start = [], 0
        for size in sizes:
            out.append((int(counts[start : start + size].sum()), whole))
            start += size
        return out


def candidates(batch: Any, rows: int) -> list[Normaliser]:
    """The normalisers this batch offers: samples, a sum, then the entries != -100 of each
    integer tensor with a sequence dimension, then the ones of each 0/1 tensor (a mask), each
    whole and from the second position. Ones that weigh this batch's rows alike are all kept:
    a later batch may tell them apart (padding that only it has)."""
    found = [Normaliser("samples"), Normaliser("sum")]
    counted = [
        (path, t)
        for path, t in _named_tensors(batch)
        if not (t.is_floating_point() or t.is_complex()) and t.dim() >= 2 and t.shape[0] == rows
    ]
    for kind in ("labels", "mask"):
        for path, t in counted:
            if kind == "mask" and not bool(((t == 0) | (t == 1)).all()):
                continue
            found += [Normaliser(kind, path, shift) for shift in (0, 1)]
    return found


def predicted(norm: Normaliser, batch: Any, a: int, b: int) -> tuple[float, float] | None:
    """The ratios (row a, row b) of the output gradient in the pair to that alone; None when a
    row counts nothing (its gradient is 0 either way: the ratio says nothing)."""
    counts = norm.per_row(batch)
    if counts is None:
        return 1.0, 1.0
    na, nb = float(counts[a]), float(counts[b])
    if na == 0 or nb == 0:
        return None
    return na / (na + nb), nb / (na + nb)


def pick_pair(cands: list[Normaliser], batch: Any, rows: int) -> tuple[int, int]:
    """Two neighbouring rows (the probe is then a view of the batch, as its parts are) that
    tell the most candidates apart (distinct predicted ratios), rows that count something for
    every candidate first."""
    best, best_score = (0, 1), (-1, -1.0)
    for a in range(min(rows, _PAIR_ROWS) - 1):
        for b in (a + 1,):
            ratios = [predicted(c, batch, a, b) for c in cands]
            known = [r for r in ratios if r is not None]
            distinct = len({(round(r[0], 4), round(r[1], 4)) for r in known})
            spread = max(r[0] for r in known) - min(r[0] for r in known) if known else 0.0
            score = (distinct + (len(known) == len(ratios)), spread)
            if score > best_score:
                best, best_score = (a, b), score
    return best


def fit_ratio(pair: torch.Tensor, alone: torch.Tensor) -> float | None:
    """The scalar r with `pair` ~= r * `alone` (least squares), or None when `alone` is zero or
    `pair` is not a multiple of it (the loss mixes rows: no normaliser rebuilds it)."""
    pair, alone = pair.double().flatten(), alone.double().flatten()
    norm = float(alone @ alone)
    if norm == 0.0:
        return None
    ratio = float(pair @ alone) / norm
    residual = float((pair - ratio * alone).norm())
    if residual > RATIO_TOLERANCE * max(float(pair.norm()), 1e-30):
        return None
    return ratio


def matching(
    cands: list[Normaliser], batch: Any, a: int, b: int, measured: tuple[float, float]
) -> list[Normaliser]:
    """The candidates whose predicted ratios are the measured ones."""
    found = []
    for cand in cands:
        want = predicted(cand, batch, a, b)
        if want is None:
            continue
        if all(abs(m - w) <= RATIO_TOLERANCE * w for m, w in zip(measured, want, strict=True)):
            found.append(cand)
    return found


def agree(norms: list[Normaliser], batch: Any, sizes: list[int]) -> bool:
    """Whether every normaliser gives each part of `sizes` the same share of this batch."""
    shares = [[a / b for a, b in n.shares(batch, sizes)] for n in norms]
    return all(
        all(abs(x - y) <= 1e-9 for x, y in zip(s, shares[0], strict=True)) for s in shares[1:]
    )


def _named_tensors(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _named_tensors(value, (*path, key))
    elif isinstance(obj, list | tuple):
        for i, value in enumerate(obj):
            yield from _named_tensors(value, (*path, i))


def _at(obj: Any, path: tuple[Any, ...]) -> torch.Tensor:
    for key in path:
        obj = obj[key]
    return obj


def _rows_of(batch: Any) -> int:
    return next(t.shape[0] for _, t in _named_tensors(batch) if t.dim() > 0)
