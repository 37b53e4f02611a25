"""Two instruments that measure the same quantity, and what to say when they disagree by more than 1.5×.

GPU busy is read two ways: PM's compute-busy counter (device-wide, over the last seconds) and the kernels' share
of the step in the traced window (one process, over the traced tokens). They differ for known reasons: a traced
token is stretched by CUPTI's own cost, so kernels cover less of it; PM counts every process on the GPU; a host
that marks ahead of the GPU cuts the step short. A screen that shows both numbers says which, and why.
"""

from __future__ import annotations

FLAG_RATIO = 1.5


def busy_disagreement(pm_busy_pct: float | None, traced_share_pct: float | None) -> str | None:
    """One line when PM's GPU busy and the traced kernels' share of the step are more than FLAG_RATIO apart, with
    the likely reason; None when they agree or one is missing."""
    if pm_busy_pct is None or traced_share_pct is None or pm_busy_pct <= 0 or traced_share_pct <= 0:
        return None
    hi, lo = max(pm_busy_pct, traced_share_pct), min(pm_busy_pct, traced_share_pct)
    if hi / lo <= FLAG_RATIO:
        return None
    if pm_busy_pct > traced_share_pct:
        why = ("the traced step is stretched by CUPTI's own cost, its marks were made ahead of the GPU (its kernels "
               "ran after them), or another process keeps the GPU busy (PM counts the whole device)")
    else:
        why = "the traced step is cut short by marks made ahead of the GPU, or PM's samples missed the traced tokens"
    return (f"GPU busy {pm_busy_pct:.0f}% (PM) against kernels {traced_share_pct:.0f}% of the step (traced "
            f"window): {hi / lo:.1f}× apart; {why}")
