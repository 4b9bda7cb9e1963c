"""`optimize(..., tune=True)`: choose the plan by measuring it.

What helps depends on the model and the machine (bf16 autocast pays on a CPU with native bf16,
`torch.compile` can make a small model slower on a CPU; figures in docs/benchmarks/cpu.md), so a
fixed recipe loses somewhere. Tuning times candidate plans on the user's own batches and keeps
the fastest one whose results agree with eager fp32. The plan `optimize()` makes without tuning
is always one of the candidates, and another plan replaces it only when measured faster by more
than the noise margin: tuning never picks a plan it measured slower than the defaults.

The package, one job per module:
- `plans`: `Plan` (values for the searched options), the default plan (the passes' own
  `choose()` decisions), the candidates.
- `apply`: the one place that runs the passes (`pipeline.prepare`, on copies) and reads
  their report; tune never imports `optimize`, which imports tune.
- `batches`: drawing a few batches from the user's loader, leaving every RNG as it was.
- `loss`: the loss tuning trains with when it does not see the user's.
- `measure`: timing each candidate on copies and judging it against eager fp32.
- `cache`: the on-disk decision cache.
- `decision`: `choose()`, the entry point, and the rule that picks the winner.

How a candidate is measured:
- The model and optimizer are deep-copied together (so the copy of the optimizer holds the copy
  of the parameters); the passes of `optimize()` are applied to the copy with the candidate's
  options. The user's model, optimizer state, BatchNorm statistics and the RNG states are left
  exactly as they were. The copies are freed after each candidate (peak memory: one extra copy).
- Dropout of every kind is switched off in the copies (dropout modules, and the float
  probabilities modules pass to a functional op, such as transformers' T5 attention's
  `self.dropout`), and every candidate's compared first step starts from the same torch RNG
  state, so that the outputs of a candidate can be compared with eager fp32's on the same batch.
  When every plan is rejected for disagreeing with eager fp32, tune warns and says so in the
  report, naming the largest difference.
- Batches: a few (`batches`, default 4) are drawn from a fresh iterator over the user's loader,
  then cycled. A re-iterable loader (a DataLoader, a list) is not consumed; the draw happens with
  the torch (CPU, CUDA), Python and numpy RNGs and the loader's own generators saved and restored,
  so every epoch of a shuffled loader is the same as without tuning. A loader with workers starts
  them once for the draw (persistent ones are shut down again). A one-shot iterator is not drawn
  from (that would eat the user's data): tuning is skipped with that reason.
- One step = forward, loss, backward, `optimizer.step()`; see `loss` for the inferred loss.
  Pass `loss_fn` to `choose()` to use the real one.
- Acceptance: the first forward of the candidate (before any step) is compared with eager fp32 on
  the same batch: relative L2 error of the outputs and relative error of the loss must be within
  `rtol` (default 0.05, loose enough for bf16, tight enough to catch a broken plan); every loss of
  the timed steps must be finite; a pass that failed and fell back (e.g. compile) rejects the
  plan. That first step runs with dropout off; the warm-up and timed steps with the model's own
  dropout, as the loop will run (a compiled plan recompiles for it in the warm-up).
- The pick, with a noise band (`decision.pick`, `trials.timing.compare`): the default plan (else
  the simplest accepted one) stays unless another is ahead of it beyond the noise of their
  side-by-side steps (the paired ratios of their i-th timed steps, run in interleaved rounds:
  a lead of NOISE_MARGIN at least, the bottom of its interval half of that); among those ahead,
  the simplest, replaced by a faster one only when that one is ahead of it beyond the noise too.
- What tuning cost (wall time of every candidate's copies, warm-ups, compiles and timed steps)
  and when the chosen plan repays it against the default plan are in the report line, and
  every figure of it in `figures`.
- Only options the user left on "auto" are searched; the others are held as given.

The decision is cached on disk (`$AUTOOPT_CACHE_DIR/tune.json`, default
`~/.cache/autoopt/tune.json`) keyed by the model's structure, the input signature, the hardware,
the torch and autoopt versions and the fixed options, so the next run starts at once. Delete the
file (or point AUTOOPT_CACHE_DIR elsewhere) to re-measure.
"""

from autoopt.runtime.tune.cache import CACHE_ENV, CACHE_FILE, cache_path
from autoopt.runtime.tune.decision import NAME, NOISE_MARGIN, Decision, choose
from autoopt.runtime.tune.loss import LossFn, infer_loss
from autoopt.runtime.tune.measure import Measurement
from autoopt.runtime.tune.plans import REFERENCE, SEARCHED, Plan, candidate_plans, default_plan

__all__ = [
    "CACHE_ENV",
    "CACHE_FILE",
    "NAME",
    "NOISE_MARGIN",
    "REFERENCE",
    "SEARCHED",
    "Decision",
    "LossFn",
    "Measurement",
    "Plan",
    "cache_path",
    "candidate_plans",
    "choose",
    "default_plan",
    "infer_loss",
]
