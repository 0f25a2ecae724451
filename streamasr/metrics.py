"""Latency metrics of simultaneous translation, as SimulEval 1.1.4 defines them.

Per instance: `delays` are the source milliseconds consumed when each target word was written
(or the compute-aware `elapsed` times), `source_ms` the source length, `reference_words` the
reference length in words (`len(reference.split(" "))`). A corpus figure is the mean over
instances that emitted at least one word; instances with no output are skipped, as SimulEval
skips them. Delays never decrease: words are written in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
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


def average_token_delay(
    delays: Sequence[float], elapsed: Sequence[float] | None = None, word_ms: float = 300.0
) -> float:
    """ATD (Kano et al., 2023, arXiv:2211.13173) for speech in, text out, as SimulEval defines it.

    The words written at one delay form a chunk; the source read since the chunk before is cut
    into pseudo-words of `word_ms` (the last one shorter). The i-th target word is paired with
    the i-th source word, moved back by how many words the output was ahead of the input when
    its chunk began, and never past the source read; ATD is the mean of (when the target word
    was written - when its source word ended). Target words take no time. With `elapsed`
    (computation-aware), each word is written later by the computation since the word before:
    t_i = max(d_i, t_(i-1)) + (e_i - d_i) - (e_(i-1) - d_(i-1)).
    """
    source_ends = [0.0]  # source_ends[s]: when the s-th source pseudo-word ended
    read_before = written_before = 0  # source and target words of the chunks before this one
    previous_delay = written_at = lag_before = 0.0
    gaps = []
    for delay, chunk in groupby(delays):
        whole, rest = divmod(delay - previous_delay, word_ms)
        for length in [word_ms] * int(whole) + ([rest] if rest else []):
            source_ends.append(source_ends[-1] + length)
        read, ahead = len(source_ends) - 1, max(0, written_before - read_before)
        written = written_before + len(list(chunk))
        for i in range(written_before, written):  # the (i + 1)-th target word
            lag = elapsed[i] - delay if elapsed is not None else 0.0
            written_at = max(delay, written_at) + lag - lag_before
            lag_before = lag
            gaps.append(written_at - source_ends[min(i + 1 - ahead, read)])
        read_before, written_before, previous_delay = read, written, delay
    return mean(gaps)


def start_offset(delays: Sequence[float]) -> float:
    """StartOffset: the delay of the first word."""
    return delays[0]


def end_offset(delays: Sequence[float], source_ms: float) -> float:
    """EndOffset: the delay of the last word minus the source length."""
    return delays[-1] - source_ms


PLAIN = ("AL", "LAAL", "DAL", "AP", "StartOffset", "EndOffset", "ATD")
AWARE = ("AL_CA", "LAAL_CA", "DAL_CA", "ATD_CA")  # computation-aware, from `elapsed`


def instance_latency(
    delays: Sequence[float],
    source_ms: float,
    reference: str | None,
    elapsed: Sequence[float] | None = None,
) -> dict[str, float] | None:
    """All word-level metrics of one instance (the computation-aware ones with `elapsed`); None
    when nothing was written."""
    if not delays:
        return None
    ref_len = len(reference.split(" ")) if reference is not None else len(delays)
    scores = {
        "AL": average_lagging(delays, source_ms, ref_len),
        "LAAL": length_adaptive_average_lagging(delays, source_ms, ref_len),
        "DAL": differentiable_average_lagging(delays, source_ms),
        "AP": average_proportion(delays, source_ms, ref_len),
        "StartOffset": start_offset(delays),
        "EndOffset": end_offset(delays, source_ms),
        "ATD": average_token_delay(delays),
    }
    if elapsed is not None:
        scores["AL_CA"] = average_lagging(elapsed, source_ms, ref_len)
        scores["LAAL_CA"] = length_adaptive_average_lagging(elapsed, source_ms, ref_len)
        scores["DAL_CA"] = differentiable_average_lagging(elapsed, source_ms)
        scores["ATD_CA"] = average_token_delay(delays, elapsed)
    return scores


def corpus_latency(
    instances: Sequence[tuple],
) -> dict[str, float | None]:
    """Mean of each metric over (delays, source_ms, reference[, elapsed]) instances with output;
    the computation-aware metrics too when every instance has its `elapsed`."""
    scores = [s for s in (instance_latency(*ins) for ins in instances) if s is not None]
    names = PLAIN + (AWARE if all(len(ins) == 4 for ins in instances) else ())
    return {name: (mean(s[name] for s in scores) if scores else None) for name in names}
