"""The sentences of a verdict, written by moesd.narration from typed parts: the only tests that read words."""

import numpy as np
import pandas as pd
import pytest

from moesd.paper import criteria as cr
from moesd.paper import sparsity_verdicts as sv
from moesd.paper import verdicts as v
from moesd import narration


def _verdict(claim, strict_status, strict_notes, material_status=None, material_notes=(), reason=None, **options):
    """A Verdict of ``claim`` with the strict reading's notes ``(outcome, part, where[, detectable, unit])``."""
    strict = [(*n, *(None, "")[len(n) - 3:], cr.CLAIM) for n in strict_notes]
    return cr.Verdict(claim, cr.Reading.from_notes(material_status or strict_status, material_notes),
                      cr.Reading.from_notes(strict_status, strict), pd.DataFrame(), options, reason)


def test_a_summary_groups_parts_by_outcome_contradicted_first_with_detectable_effects():
    notes = [(cr.NOT_SHOWN, "the later peak", "gamma = 2", 24.0, "B"),
             (cr.NOT_SHOWN, "the later peak", "gamma = 4", 31.0, "B"),
             (cr.CONTRADICTED, "K = 2's monotone fall", "gamma = 2"),
             (cr.CONTRADICTED, "K = 2's monotone fall", "gamma = 4"),
             (cr.SHOWN, "the wider range", "gamma = 2")]
    verdict = _verdict("Fig. 4", cr.FAILS, notes, cr.UNTESTABLE)
    assert narration.summary(verdict, "strict") == (
        "does not hold: K = 2's monotone fall contradicted by the data (gamma = 2, 4); "
        "the later peak not shown beyond noise (gamma = 2, 4; detectable from 24-31 B)")
    assert list(verdict.strict.parts["outcome"]) == [cr.NOT_SHOWN, cr.NOT_SHOWN, cr.CONTRADICTED, cr.CONTRADICTED,
                                                     cr.SHOWN]
    assert np.isnan(verdict.strict.parts["detectable"].iloc[2])
    assert narration.plain(verdict).startswith("Fig. 4 is not testable here as the paper states it")
    assert "read strictly it does not hold" in narration.plain(verdict)


def test_a_claim_that_holds_or_cannot_be_tested_says_so_in_its_summary():
    assert narration.summary(_verdict("Fig. 2", cr.HOLDS, [])) == cr.HOLDS
    missing = _verdict("Fig. 2", cr.UNTESTABLE, [], reason=cr.NO_STUDY, studies=("e2e",))
    assert narration.summary(missing) == "not testable here: no complete e2e study on this device"
    assert narration.plain(missing) == "Fig. 2 is not testable here: no complete e2e study on this device."
    assert narration.sentence(missing, "strict") == (f"Fig. 2 ({cr.CLAIMS['Fig. 2'].statement}): not testable here "
                                                     "- no complete e2e study on this device.")


def test_every_reason_code_has_its_words():
    options = {"studies": ("forward", "dense_forward"), "gammas": (2, 3), "error": "no measured roofline"}
    phrases = {reason: narration.reason_phrase(reason, options) for reason in cr.REASONS}
    assert len(set(phrases.values())) == len(cr.REASONS)
    assert phrases[cr.NO_STUDY] == "no complete forward and dense_forward study on this device"
    assert phrases[cr.NOT_FITTED].endswith("no measured roofline")


def test_the_statement_carries_the_options_it_was_judged_with():
    fig4 = _verdict("Fig. 4", cr.HOLDS, [], monotone_ks=(1,), from_batch_size=2)
    assert "K = 1 fall" in narration.statement(fig4) and narration.statement(fig4).endswith("judged from B = 2")
    assert "B > 8" in narration.statement(_verdict("Fig. 6", cr.HOLDS, [], beyond=8))
    assert narration.statement(_verdict("Fig. 2", cr.HOLDS, [])) == cr.CLAIMS["Fig. 2"].statement
    with pytest.raises(ValueError, match="reading must be"):
        narration.summary(fig4, "lenient")


def test_a_detail_is_named_as_one():
    material = [(cr.CONTRADICTED, "the small run-to-run spread", "mtbench T=1", None, "", cr.DETAIL)]
    verdict = _verdict("Fig. 5", cr.HOLDS, [], cr.HOLDS, material)
    assert "spread (a detail) contradicted" in narration.summary(verdict)


def test_records_keep_every_value_and_has_tells_a_row_never_judged():
    from moesd.narration.details import has

    numbers = pd.DataFrame([{"gamma": 2, "where": "gamma = 2"},
                            {"gamma": 4, "where": "gamma = 4", "first": 1.5, "rank_correlation": float("nan")}])
    rows = narration.records(numbers)
    assert not has(rows[0], "first") and has(rows[1], "first") and rows[0]["gamma"] == 2
    assert "rank_correlation" in rows[1] and np.isnan(rows[1]["rank_correlation"])


def test_a_flat_efficiency_curve_is_worded_with_its_nan_correlation():
    """A verdict value that is NaN (the rank correlation of a constant curve) is written, not lost."""
    from test_verdicts import e2e_study, hump

    study = e2e_study(lambda b: hump(b, 24), lambda b: hump(b, 20, 0.6, 0.3))
    study.loc[study["gamma"] == 2, "target_efficiency"] = 0.9
    verdict = v.speedup_rises_then_falls(study)
    assert np.isnan(verdict.numbers.set_index("gamma").loc[2, "rank_correlation"])
    assert "rank correlation nan (does not track)" in narration.sentence(verdict)
    card = narration.worded(pd.DataFrame({"verdict": [verdict]}))
    assert card.loc[0, "sentence"] == narration.sentence(verdict) and card.loc[0, "plain"] == narration.plain(verdict)
    assert card.loc[0, "strict_summary"] == narration.summary(verdict, "strict")


def test_real_verdicts_name_their_options_and_worst_fit():
    from test_verdicts import e2e_study, falling, hump, paper_robustness

    moe = e2e_study(lambda b: hump(b, 24), lambda b: hump(b, 24))
    dense = e2e_study(falling, falling)
    judged = v.moe_above_dense(moe, dense, beyond=8, from_batch_size=2)
    assert "B > 8" in narration.sentence(judged) and narration.sentence(judged).count("judged from B = 2") == 1
    assert "past 8" in narration.plain(judged)
    table3 = sv.poor_coverage_worst_fits(paper_robustness())
    assert "the worst fit (m = 12" in narration.sentence(table3, "strict")
    with pytest.raises(ValueError, match="no details"):
        narration.details(_verdict("Fig. 9", cr.HOLDS, []))


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
