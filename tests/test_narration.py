"""The sentences of a verdict, written by moesd.narration from typed parts: the only tests that read words."""

import numpy as np

from moesd.paper import criteria as cr
from moesd import narration


def _notes(notes):
    return {"strict": [(*n, *(None, "")[len(n) - 3:], cr.CLAIM) for n in notes], "material": []}


def test_a_summary_groups_parts_by_outcome_contradicted_first_with_detectable_effects():
    notes = [(cr.NOT_SHOWN, "the later peak", "gamma = 2", 24.0, "B"),
             (cr.NOT_SHOWN, "the later peak", "gamma = 4", 31.0, "B"),
             (cr.CONTRADICTED, "K = 2's monotone fall", "gamma = 2"),
             (cr.CONTRADICTED, "K = 2's monotone fall", "gamma = 4"),
             (cr.SHOWN, "the wider range", "gamma = 2")]
    verdict = narration.verdict("Fig. 4", "a claim", {"strict": cr.FAILS, "material": cr.UNTESTABLE}, [],
                                _notes(notes), "the details")
    assert verdict.strict.summary == ("does not hold: K = 2's monotone fall contradicted by the data (gamma = 2, 4); "
                                      "the later peak not shown beyond noise (gamma = 2, 4; detectable from 24-31 B)")
    assert verdict.strict.sentence == "Fig. 4 (a claim): does not hold - the details."
    assert list(verdict.strict.parts["outcome"]) == [cr.NOT_SHOWN, cr.NOT_SHOWN, cr.CONTRADICTED, cr.CONTRADICTED,
                                                     cr.SHOWN]
    assert np.isnan(verdict.strict.parts["detectable"].iloc[2])
    assert verdict.plain.startswith("Fig. 4 is not testable here as the paper states it")
    assert "read strictly it does not hold" in verdict.plain


def test_a_claim_that_holds_or_cannot_be_tested_says_so_in_its_summary():
    both = {"strict": cr.HOLDS, "material": cr.HOLDS}
    assert narration.verdict("Fig. 2", "s", both, [], _notes([]), "numbers").summary == cr.HOLDS
    missing = narration.verdict("Fig. 2", "s", dict.fromkeys(both, cr.UNTESTABLE), [], _notes([]),
                                narration.no_study("e2e"))
    assert missing.summary == "not testable here: no complete e2e study on this device"
    assert missing.plain == "Fig. 2 is not testable here: no complete e2e study on this device."


def test_a_detail_is_named_as_one():
    notes = {"strict": [], "material": [(cr.CONTRADICTED, "the small run-to-run spread", "mtbench T=1", None, "",
                                         cr.DETAIL)]}
    verdict = narration.verdict("Fig. 5", "s", {"strict": cr.HOLDS, "material": cr.HOLDS}, [], notes, "numbers")
    assert "spread (a detail) contradicted" in verdict.summary


def test_numbers_for_prose():
    assert narration.number(2.345) == "2.35" and narration.number(24.0, whole=True) == "24"
    assert narration.span([1.0, 1.004]) == "1.00" and narration.span([0.5, 2]) == "0.50-2.00"
    assert narration.span([-1.0, 2.0]) == "-1.00 to 2.00"
    assert narration.batch_runs([1, 4, 8], [1, 2, 4, 8]) == "B = 1, 4-8"
    assert narration.batch_runs([], [1, 2]) == "no batch size"
    assert narration.span(np.array([3.24, 4.46]), digits=1) == "3.2-4.5"
    assert narration.span([16.0, 16.4], digits=0) == "16"  # both ends read the same
    assert narration.number(0.555, digits=1) == "0.6" and narration.number(2.4, whole=True, digits=3) == "2"
    assert narration.judged_from("claim", None) == "claim" and narration.judged_from("claim", 4).endswith("B = 4")


def _advice(**changes):
    """An Advice of three batch sizes, SD on at all of them, with ``changes``."""
    import dataclasses

    import pandas as pd

    from moesd.predictor.recommend import Advice

    best = pd.DataFrame({"batch_size": [1, 2, 4], "speedup": [1.5, 1.6, 1.7], "sd": ["on"] * 3})
    advice = Advice("alpha", 0.8, best, np.array([1, 2, 4]), np.array([], dtype=int), 1.7, 4, (1, 4), 3.8,
                    np.array([1, 2, 4]), False)
    return dataclasses.replace(advice, **changes)


def test_sd_not_judged_says_so_without_on_or_off():
    from moesd.predictor.recommend import NOT_JUDGED

    advice = _advice(judged=False, on=np.array([], dtype=int), host_decides=True,
                     best=_advice().best.assign(sd=NOT_JUDGED))
    text = narration.where_sd_pays(advice, 0.05)
    assert text.startswith("not judged: nothing fits") and "pays" not in text and " on " not in text
    assert "host cost" not in text  # nothing is decided where nothing is judged
    assert "SD pays" in narration.where_sd_pays(_advice(), 0.05)


def test_the_peak_at_an_end_and_an_alpha_from_an_acceptance_length():
    assert narration.peak_edge_phrase(_advice(peak_edge="largest")).endswith("try larger --batch)")
    assert narration.peak_edge_phrase(_advice(peak_edge="smallest")).endswith("try smaller --batch)")
    assert narration.peak_edge_phrase(_advice()) == ""
    label = narration.acceptance_label(_advice(value=2.71051e-20), "1@3")
    assert label.startswith("alpha = 0.000 (") and label.endswith("--acceptance-length 1@3)")
    assert narration.acceptance_label(_advice()) == "alpha = 0.8"
