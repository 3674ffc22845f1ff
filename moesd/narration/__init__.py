"""Every sentence the package writes about a result: the verdicts on the paper's claims and the
predictor's recommendation.

The criteria (:mod:`moesd.paper.criteria`), the claims (:mod:`moesd.paper.verdicts`) and the
recommendation (:mod:`moesd.predictor.recommend`) compute statuses, numbers and parts; the words are
written here only, in a module per topic: numbers and phrases (:mod:`~moesd.narration.phrases`), the
verdicts' readings and plain sentences (:mod:`~moesd.narration.verdicts`), the details of each claim's
sentence (:mod:`~moesd.narration.details`), the report ``moesd predict`` prints
(:mod:`~moesd.narration.predictor`), trained routing (:mod:`~moesd.narration.routing`) and the tables a
chapter shows (:mod:`~moesd.narration.tables`). The names below
are the package's API: ``from moesd import narration; narration.span(...)``. A wording change touches this
package alone, and tests assert fields, not sentences.
"""

from moesd.narration.phrases import (fall_phrase, join, judged_from, noise_phrase, number, parts_phrase,
                                     shape_phrase, shapes_phrase, span)
from moesd.narration.verdicts import (TOLERANCE_PHRASE, WHY_READINGS_DIFFER, plain, sentence, statement, status_verb,
                                      summary, worded)
from moesd.narration.details import details, reason_phrase, records
from moesd.narration.predictor import (STEP_NOTE, acceptance_label, advice_report, band_line, batch_runs,
                                       engine_range, memory_lines, peak_edge_phrase, predict_notes, predict_setup,
                                       routing_source_line, sd_legend, shape_columns, where_sd_pays)
from moesd.narration.routing import (fig1_sentence, fig1_summary, popularity_peak_sentence)
from moesd.narration.tables import Table, formatted

__all__ = ['STEP_NOTE', 'TOLERANCE_PHRASE', 'Table', 'WHY_READINGS_DIFFER', 'acceptance_label',
           'advice_report', 'band_line', 'batch_runs', 'details', 'engine_range', 'fall_phrase',
           'fig1_sentence', 'fig1_summary', 'formatted', 'join', 'judged_from', 'memory_lines',
           'noise_phrase', 'number', 'parts_phrase', 'peak_edge_phrase', 'plain',
           'popularity_peak_sentence', 'predict_notes', 'predict_setup', 'reason_phrase', 'records',
           'routing_source_line', 'sd_legend', 'sentence', 'shape_columns', 'shape_phrase', 'shapes_phrase',
           'span', 'statement', 'status_verb', 'summary', 'where_sd_pays', 'worded']
