"""Latency metrics of simultaneous translation, as SimulEval 1.1.4 defines them.

Per instance: `delays` are the source milliseconds consumed when each target word was written
(or the compute-aware `elapsed` times), `source_ms` the source length, `reference_words` the
reference length in words (`len(reference.split(" "))`). A corpus figure is the mean over
instances that emitted at least one word; instances with no output are skipped, as SimulEval
skips them.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean


def average_lagging(delays: Sequence[float], source_ms: float, target_len: float) -> float:
    """AL (Ma et al., 2019, STACL, arXiv:1810.08398).

    AL = 1/tau * sum_{i=1..tau} (d_i - (i - 1) * |X| / |Y|), tau = the first i with d_i >= |X|,
    |Y| the reference length. A first delay past the source end returns that delay.
    """
    if delays[0] > source_ms:
        return delays[0]
    rate = source_ms / target_len  # source ms per target word of an ideal translator
    total, tau = 0.0, 0
    for i, delay in enumerate(delays):
        total += delay - i * rate
        tau = i + 1
        if delay >= source_ms:
            break
    return total / tau


def length_adaptive_average_lagging(
    delays: Sequence[float], source_ms: float, reference_len: float
) -> float:
    """LAAL (Papi et al., 2022, arXiv:2206.05807): AL with |Y| = max(|hypothesis|, |reference|),
    so over-long output is not rewarded."""
    return average_lagging(delays, source_ms, max(len(delays), reference_len))


def average_proportion(delays: Sequence[float], source_ms: float, target_len: float) -> float:
    """AP (Cho and Esipova, 2016, arXiv:1606.02012): AP = sum_i d_i / (|X| * |Y|), |Y| the
    reference length."""
    return sum(delays) / (source_ms * target_len)


def differentiable_average_lagging(delays: Sequence[float], source_ms: float) -> float:
    """DAL (Arivazhagan et al., 2019, arXiv:1906.05218), |Y| = the hypothesis length:
    g'_1 = d_1, g'_i = max(d_i, g'_{i-1} + |X| / |Y|); DAL = 1/|Y| sum_i (g'_i - (i - 1) |X| / |Y|).
    """
    rate = source_ms / len(delays)
    total, previous = 0.0, 0.0
    for i, delay in enumerate(delays):
        current = delay if i == 0 else max(delay, previous + rate)
        total += current - i * rate
        previous = current
    return total / len(delays)


def start_offset(delays: Sequence[float]) -> float:
    """StartOffset: the delay of the first word."""
    return delays[0]


def end_offset(delays: Sequence[float], source_ms: float) -> float:
    """EndOffset: the delay of the last word minus the source length."""
    return delays[-1] - source_ms


def instance_latency(
    delays: Sequence[float], source_ms: float, reference: str | None
) -> dict[str, float] | None:
    """All word-level metrics of one instance; None when nothing was written."""
    if not delays:
        return None
    ref_len = len(reference.split(" ")) if reference is not None else len(delays)
    return {
        "AL": average_lagging(delays, source_ms, ref_len),
        "LAAL": length_adaptive_average_lagging(delays, source_ms, ref_len),
        "DAL": differentiable_average_lagging(delays, source_ms),
        "AP": average_proportion(delays, source_ms, ref_len),
        "StartOffset": start_offset(delays),
        "EndOffset": end_offset(delays, source_ms),
    }


def corpus_latency(
    instances: Sequence[tuple[Sequence[float], float, str | None]],
) -> dict[str, float | None]:
    """Mean of each metric over (delays, source_ms, reference) instances with output."""
    scores = [s for s in (instance_latency(*ins) for ins in instances) if s is not None]
    names = ("AL", "LAAL", "DAL", "AP", "StartOffset", "EndOffset")
    return {name: (mean(s[name] for s in scores) if scores else None) for name in names}
