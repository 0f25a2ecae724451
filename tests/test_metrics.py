"""Latency metrics: hand-computed cases, edge cases, and agreement with SimulEval 1.1.4."""

from __future__ import annotations

import pytest

from streamasr.metrics import (
    average_lagging,
    average_proportion,
    average_token_delay,
    corpus_latency,
    differentiable_average_lagging,
    instance_latency,
    length_adaptive_average_lagging,
)


def test_al_hand_computed():
    # |X| = 1000 ms, |Y| = 4 -> 250 ms per word; tau = 3 (the first delay reaching 1000)
    delays = [300, 600, 1000, 1000]
    expected = ((300 - 0) + (600 - 250) + (1000 - 500)) / 3
    assert average_lagging(delays, 1000, 4) == pytest.approx(expected)


def test_laal_uses_the_longer_of_hypothesis_and_reference():
    delays = [300, 600, 1000, 1000, 1000]  # 5 words against a 4-word reference
    rate = 1000 / 5
    expected = (300 + (600 - rate) + (1000 - 2 * rate)) / 3
    assert length_adaptive_average_lagging(delays, 1000, 4) == pytest.approx(expected)
    assert average_lagging(delays, 1000, 4) == pytest.approx((300 + 350 + 500) / 3)


def test_first_delay_past_source_end():
    assert average_lagging([1200, 1300], 1000, 2) == 1200
    assert length_adaptive_average_lagging([1200], 1000, 3) == 1200


def test_ap_and_dal_hand_computed():
    delays = [200, 200, 900]
    assert average_proportion(delays, 1000, 4) == pytest.approx(1300 / 4000)
    # DAL: rate = 1000 / 3; g' = 200, max(200, 533.3) = 533.3, max(900, 866.7) = 900
    rate = 1000 / 3
    expected = (200 + (200 + rate - rate) + (900 - 2 * rate)) / 3
    assert differentiable_average_lagging(delays, 1000) == pytest.approx(expected)


def test_atd_hand_computed():
    # 300 ms source pseudo-words: [0, 300, 320] read by 320, then 620, 640 by 640; the two words
    # at 640 pair with the 2nd and 3rd source words (the output one word behind the input)
    assert average_token_delay([320, 640, 640]) == pytest.approx(
        ((320 - 300) + (640 - 320) + (640 - 620)) / 3
    )
    # three words at 320 ms: one word ahead of the 2-word source from the 3rd word on, so the 4th
    # (at 640) pairs with source word 4 - 1 = 3 (ended at 620)
    assert average_token_delay([320, 320, 320, 640]) == pytest.approx(
        ((320 - 300) + (320 - 320) + (320 - 320) + (640 - 620)) / 4
    )
    # computation-aware: the first word 50 ms late, the second 30 ms more
    assert average_token_delay([320, 640], [370, 720]) == pytest.approx(
        ((370 - 300) + (640 + 30 - 320)) / 2
    )


def test_empty_translation_is_skipped():
    assert instance_latency([], 1000, "ein Hund") is None
    corpus = corpus_latency([([], 1000, "a b"), ([500, 1000], 1000, "a b")])
    assert corpus["AL"] == pytest.approx((500 + 500) / 2)
    assert corpus["StartOffset"] == 500 and corpus["EndOffset"] == 0
    assert corpus_latency([([], 1000, "a")])["AL"] is None
    assert "ATD_CA" not in corpus and corpus_latency([])["ATD_CA"] is None


def test_agrees_with_simuleval_1_1_4():
    """The same delay traces through SimulEval's own scorers: per instance and corpus means."""
    from types import SimpleNamespace

    scorers = pytest.importorskip("simuleval.evaluator.scorers.latency_scorer")
    traces = [
        ([320.0, 640.0, 960.0, 1280.0, 1500.0, 1500.0], 1500.0, "Ein Mann mit einem Hut ."),
        ([960.0, 960.0, 2000.0, 2600.0], 2400.0, "Zwei Hunde spielen im Schnee ."),
        ([3000.0], 2500.0, "Leute gehen ."),
        ([100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0], 700.0, "kurz"),
        ([], 900.0, "leer"),  # no output: skipped by both
    ]
    instances = {
        i: SimpleNamespace(
            delays=d,
            source_length=src,
            reference=ref,
            reference_length=len(ref.split(" ")),
            metrics={},
        )
        for i, (d, src, ref) in enumerate(traces)
    }
    ours = corpus_latency(traces)
    for name in ("AL", "LAAL", "AP", "DAL", "StartOffset", "EndOffset"):
        theirs = scorers.LATENCY_SCORERS_DICT[name]()(instances)
        assert ours[name] == pytest.approx(theirs), name
        for ins in instances.values():
            if ins.delays:
                mine = instance_latency(ins.delays, ins.source_length, ins.reference)[name]
                assert mine == pytest.approx(ins.metrics[name]), (name, ins.delays)


def test_atd_agrees_with_simuleval_1_1_4():
    """ATD and its computation-aware twin against SimulEval's scorer (speech in, text out: 300 ms
    source words), on traces with words written together, late computation and uneven chunks."""
    import json

    instance = pytest.importorskip("simuleval.evaluator.instance")
    scorers = pytest.importorskip("simuleval.evaluator.scorers.latency_scorer")
    traces = [
        ([320.0, 640.0, 960.0, 1280.0, 1500.0, 1500.0], [350.0, 700.0, 990.0, 1400.0, 1620.0, 1625.0]),
        ([960.0, 960.0, 960.0, 2000.0, 2600.0], [1000.0, 1010.0, 1020.0, 2050.0, 2605.0]),
        ([3000.0], [3400.0]),
        ([100.0, 200.0, 333.5, 400.0, 1234.5, 1234.5, 2700.0], [180.0, 260.0, 500.0, 510.0, 1300.0, 1300.0, 2800.0]),
    ]  # fmt: skip
    for delays, elapsed in traces:
        log = {"index": 0, "delays": delays, "elapsed": elapsed, "source_length": 3000.0}
        instances = {0: instance.LogInstance(json.dumps(log | {"reference": "a b"}))}
        for aware in (False, True):
            theirs = scorers.LATENCY_SCORERS_DICT["ATD"](computation_aware=aware)(instances)
            mine = average_token_delay(delays, elapsed if aware else None)
            assert mine == pytest.approx(theirs), (delays, aware)
        scores = instance_latency(delays, 3000.0, "a b", elapsed)
        assert scores["ATD"] == average_token_delay(delays)
        assert scores["ATD_CA"] == average_token_delay(delays, elapsed)
        assert scores["AL_CA"] == average_lagging(elapsed, 3000.0, 2)
