"""What measured studies say: target efficiency and Eq. 4's terms from forward and end-to-end studies,
the frame Algorithm 1 is fitted to, and what a study's sidecar records: the measured roofline of the device
(:func:`measuring_hardware`, :func:`measured_device`), its ridge point, the bytes per weight of the sweep's dtype
and the shapes of the models the sweep built (:func:`measured_shapes`).

Everything here takes studies as :func:`moesd.measure.studies.load` returns them (pure pandas and
numpy, no torch).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from moesd._checks import UsageError
from moesd.architecture import Architecture
from moesd.theory.roofline import Hardware


FITTING_COLUMNS = ("batch_size", "gamma", "num_experts_per_tok", "sigma", "speedup")
"""Columns of an e2e-type result file that Algorithm 1 is fitted to."""


def routed_experts(sidecar: dict) -> int:
    """E, the routed experts per layer of the target a result file measured (its sidecar's target in
    :mod:`moesd.zoo`).

    Raises
    ------
    ValueError
        If the sidecar names no target or a dense one.
    KeyError
        If :mod:`moesd.zoo` does not know the target.
    """
    from moesd.zoo import get_model

    target = sidecar.get("settings", {}).get("target")
    if target is None:
        raise ValueError("the sidecar names no target (settings.target); is it a moesd.measure.bench sidecar?")
    spec = get_model(target)
    if not spec.is_moe:
        raise ValueError(f"{target} is dense: Algorithm 1 needs routed experts")
    return spec.num_experts


def fitting_frame(rows: pd.DataFrame, sidecar: dict) -> pd.DataFrame:
    """Algorithm 1's measurements (columns B, gamma, K, E, sigma, speedup) of an e2e-type result file.

    ``E`` (routed experts per layer of the target) comes from the sidecar (:func:`routed_experts`);
    ``K`` from each row.

    Raises
    ------
    ValueError
        If the target is dense, the rows lack a column, or the sidecar names no target.
    """
    experts = routed_experts(sidecar)
    missing = [c for c in FITTING_COLUMNS if c not in rows]
    if missing:
        raise ValueError(f"the rows lack {', '.join(missing)}: fitting needs an e2e, sparsity or settings study")
    return pd.DataFrame({"B": rows["batch_size"], "gamma": rows["gamma"], "K": rows["num_experts_per_tok"],
                         "E": experts, "sigma": rows["sigma"], "speedup": rows["speedup"]})


def forward_target_efficiency(forward: pd.DataFrame, gammas=(2, 3, 4), role: str = "target") -> pd.DataFrame:
    """Target efficiency ``T_T(B, 1) / T_T(B, gamma)`` from a forward study, per batch size.

    The verification pass scores ``gamma + 1`` positions per sequence (as vLLM and :mod:`moesd.engine.sd` do).
    The ratio is taken within each repeat (``run``), whose passes are timed minutes apart at most, and
    then summarised over repeats: a slow drift of the machine (seen on the shared CPU host as whole
    repeats running 30 % slower) scales both passes of a repeat alike and cancels, where a ratio of
    medians taken over repeats separately would not.

    Parameters
    ----------
    forward : pandas.DataFrame
        A forward study's rows (``run``, ``role``, ``batch_size``, ``tokens``, ``seconds``).
    gammas : sequence of int
        Draft lengths; the study must hold passes of ``gamma + 1`` tokens per sequence.
    role : {"target", "draft"}
        The model whose passes are compared.

    Returns
    -------
    pandas.DataFrame
        Columns ``batch_size``, ``gamma``, ``efficiency`` (median over repeats of the per-repeat ratio),
        ``low`` and ``high`` (its quartiles over repeats), ``runs``.
    """
    passes = forward[forward["role"] == role].pivot_table(index=["run", "batch_size"], columns="tokens",
                                                           values="seconds")
    parts = []
    for gamma in gammas:
        if gamma + 1 not in passes.columns or 1 not in passes.columns:
            raise ValueError(f"the forward study has no {role} pass of 1 and {gamma + 1} tokens per sequence")
        ratio = (passes[1] / passes[gamma + 1]).dropna().groupby(level="batch_size")
        parts.append(pd.DataFrame({"gamma": gamma, "efficiency": ratio.median(), "low": ratio.quantile(0.25),
                                   "high": ratio.quantile(0.75), "runs": ratio.size()}))
    return pd.concat(parts).reset_index()


def efficiency_landmarks(tables: dict) -> pd.DataFrame:
    """The landmarks of target-efficiency curves: at the smallest batch size, the peak and where, at the largest.

    Parameters
    ----------
    tables : dict of str to pandas.DataFrame
        :func:`forward_target_efficiency` tables by a label whose first word names the model (``"MoE (...)"``).

    Returns
    -------
    pandas.DataFrame
        Indexed by ``model`` (the label's first word) and ``gamma``: ``B = 1`` (the smallest batch size's
        efficiency), ``peak``, ``peak at B`` and ``B = 100`` (the largest batch size's).
    """
    rows = []
    for name, table in tables.items():
        for gamma, part in table.groupby("gamma"):
            part = part.set_index("batch_size")["efficiency"]
            rows.append({"model": name.split(" ")[0], "gamma": gamma, "B = 1": part.iloc[0], "peak": part.max(),
                         "peak at B": part.idxmax(), "B = 100": part.iloc[-1]})
    return pd.DataFrame(rows).set_index(["model", "gamma"])


def mean_activated_experts(forward: pd.DataFrame, tokens: int) -> pd.Series:
    """Mean activated experts per batch size over a forward study's passes of ``tokens`` new tokens per sequence
    (the rows' ``activated_experts``: the distinct experts per MoE layer of a forward)."""
    return forward[forward["tokens"] == tokens].groupby("batch_size")["activated_experts"].mean()


def pass_time_ratio(forward: pd.DataFrame, tokens: int, batch_size: int = 1, role: str = "target") -> float:
    """``T(B, tokens) / T(B, 1)`` of a forward study: the ratio within each repeat (``run``), then the median over
    repeats (as :func:`forward_target_efficiency` takes it, inverted)."""
    rows = forward[(forward["role"] == role) & (forward["batch_size"] == batch_size)]
    passes = rows.pivot_table(index="run", columns="tokens", values="seconds")
    return float((passes[tokens] / passes[1]).median())


EQ4_TERMS = ("tokens_per_round", "verify", "draft", "reject")
"""Eq. 4's terms (:class:`moesd.theory.speedup.SpeedupTerms`), in the order of the tables."""


def eq4_terms(study: pd.DataFrame, by=("gamma", "batch_size"), step: str = "t_ar") -> pd.DataFrame:
    """Eq. 4's terms of every row of an e2e-type study, averaged over the rows of each group.

    Each row's measured stage times go into :func:`moesd.theory.speedup.speedup_terms` with ``T_T(B, 1)``
    taken from the column ``step``: ``"t_ar"``, the AR step (forward, token selection and bookkeeping:
    Eq. 3's time per token, with which the terms recombine to the measured speedup, as the
    ``speedup_eq4`` column), or ``"t_target_1"``, the forward alone (the paper's definition).

    Parameters
    ----------
    study : pandas.DataFrame
        Rows of an e2e-type study (``sigma``, ``gamma``, ``step``, ``t_target_gamma``, ``t_draft``,
        ``t_reject``, ``speedup`` and the columns of ``by``).
    by : sequence of str
        Columns to group by.
    step : {"t_ar", "t_target_1"}
        The column that is ``T_T(B, 1)``, in seconds.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``by``: ``tokens_per_round`` (sigma (gamma + 1)), ``verify`` (``T_T(B, gamma) / T_T(B, 1)``),
        ``draft`` (``gamma T_D(B, 1) / T_T(B, 1)``) and ``reject`` (``T_reject / T_T(B, 1)``), all
        dimensionless; the means of ``speedup`` and of ``sigma``, ``speedup_eq4`` and ``target_efficiency``
        where the study has them; ``denominator`` (the three terms' sum: a round's cost in decode steps),
        ``recombined`` (Eq. 4 of the mean terms) and ``rows``.
    """
    from moesd.theory.speedup import speedup_terms

    if step not in ("t_ar", "t_target_1"):
        raise ValueError(f"step must be 't_ar' or 't_target_1', got {step!r}")
    by = list(by)
    terms = speedup_terms(study["sigma"], study["gamma"], study[step], study["t_target_gamma"], study["t_draft"],
                          study["t_reject"])
    kept = [column for column in ("sigma", "speedup", "speedup_eq4", "target_efficiency") if column in study]
    rows = study[by + kept].assign(**{name: np.asarray(getattr(terms, name)) for name in EQ4_TERMS})
    grouped = rows.groupby(by)
    means = grouped.mean()
    means["denominator"] = means["verify"] + means["draft"] + means["reject"]
    means["recombined"] = means["tokens_per_round"] / means["denominator"]
    means["rows"] = grouped.size()
    return means


def forward_speedup(forward: pd.DataFrame, sigma, gammas=(2, 3, 4), per_repeat: bool = False) -> pd.DataFrame:
    """Eq. 4 evaluated from a forward study's stage times, per batch size and gamma.

    Within each repeat (``run``): ``T_T(B, 1)`` and ``T_T(B, gamma + 1)`` of the target (the verification
    scores ``gamma + 1`` positions per sequence, as in :func:`forward_target_efficiency`) and ``T_D(B, 1)``
    of the draft go into :func:`moesd.theory.speedup.speedup_terms` with the given sigma and no rejection cost;
    the result is summarised over repeats like :func:`forward_target_efficiency` (pairing a repeat's passes
    cancels slow drifts of the machine). Every sequence is active in every round by construction, so
    this is the speedup of the steady-state protocol without its selection and bookkeeping time.

    Parameters
    ----------
    forward : pandas.DataFrame
        A forward study's rows (``run``, ``role``, ``batch_size``, ``tokens``, ``seconds``), target and draft.
    sigma : float or dict
        Emitted fraction of the ``gamma + 1`` tokens per round: one value, or one per gamma
        (``{gamma: sigma}``; keys may be strings, as in a sidecar's ``acceptance``).
    gammas : sequence of int
        Draft lengths; the study must hold target passes of 1 and ``gamma + 1`` tokens per sequence and
        draft passes of 1.
    per_repeat : bool
        Return each repeat's values instead of their summary.

    Returns
    -------
    pandas.DataFrame
        Columns ``batch_size``, ``gamma``, ``sigma``, ``speedup`` (median over repeats), ``low`` and
        ``high`` (its quartiles), ``draft_term`` (median of ``gamma T_D(B, 1) / T_T(B, 1)``), ``runs``.
        With ``per_repeat``: one row per repeat, batch size and gamma, columns ``run``, ``batch_size``,
        ``gamma``, ``sigma``, ``speedup`` and Eq. 4's denominator terms ``verify``
        (``T_T(B, gamma + 1) / T_T(B, 1)``) and ``draft`` (``gamma T_D(B, 1) / T_T(B, 1)``).
    """
    from moesd.theory.speedup import speedup_terms

    passes = forward.pivot_table(index=["run", "batch_size"], columns=["role", "tokens"], values="seconds")
    parts = []
    for gamma in gammas:
        needed = [("target", 1), ("target", gamma + 1), ("draft", 1)]
        missing = [f"{role} pass of {tokens}" for role, tokens in needed if (role, tokens) not in passes.columns]
        if missing:
            raise ValueError(f"the forward study has no {' or '.join(missing)} tokens per sequence")
        value = float(sigma[gamma] if gamma in sigma else sigma[str(gamma)]) if isinstance(sigma, dict) else float(sigma)
        complete = passes[needed].dropna()
        terms = speedup_terms(value, gamma, *(complete[column].to_numpy() for column in needed))
        parts.append(pd.DataFrame({"gamma": gamma, "sigma": value, "speedup": terms.speedup, "verify": terms.verify,
                                   "draft": terms.draft}, index=complete.index).reset_index())
    repeats = pd.concat(parts, ignore_index=True)
    if per_repeat:
        return repeats
    by = repeats.groupby(["gamma", "batch_size"])
    ratio = by["speedup"]
    return pd.DataFrame({"sigma": by["sigma"].first(), "speedup": ratio.median(), "low": ratio.quantile(0.25),
                         "high": ratio.quantile(0.75), "draft_term": by["draft"].median(),
                         "runs": ratio.size()}).reset_index()[
        ["batch_size", "gamma", "sigma", "speedup", "low", "high", "draft_term", "runs"]]


def measuring_hardware(sidecar: dict) -> Hardware:
    """The measured roofline of the device that produced a result file (its sidecar's ``hardware``).

    Raises
    ------
    ValueError
        If the sidecar holds no measured roofline (a sweep from before moesd recorded one).
    """
    record = sidecar.get("hardware")
    if not record:
        raise ValueError(f"the sidecar of this result file ({sidecar.get('device', 'unknown device')}, "
                         f"{sidecar.get('date', 'undated')}) holds no measured roofline; re-run the sweep "
                         "with this version of moesd, or pass the ridge point yourself")
    return Hardware.from_dict(record)


def measured_shapes(sidecar: dict) -> tuple[Architecture, Architecture]:
    """The target's and draft's shapes of a ``moesd sweep`` (scaled by its layers and width settings).

    The draft shares the target's vocabulary, as :func:`moesd.measure.bench.build_models` builds it (the
    sweep's ``vocab_size`` when it set one).
    """
    from moesd.zoo import get_model

    settings = sidecar.get("settings", {})
    missing = [k for k in ("target", "draft", "layers", "draft_layers", "width") if k not in settings]
    if missing:
        raise UsageError(f"sidecar: settings lack {', '.join(missing)}", "sidecar")
    target_spec, draft_spec = get_model(settings["target"]), get_model(settings["draft"])
    target = target_spec.architecture(settings["layers"], width=settings["width"])
    if settings.get("vocab_size"):  # a vocabulary cut apart from the width (moesd.zoo.depth_scaled_vocab)
        target = Architecture.from_config(target_spec.name, target_spec.model_type,
                                          {**target_spec.config_dict(settings["layers"], width=settings["width"]),
                                           "vocab_size": settings["vocab_size"]})
    draft_config = {**draft_spec.config_dict(settings["draft_layers"], width=settings["width"]),
                    "vocab_size": target.vocab_size}
    return target, Architecture.from_config(draft_spec.name, draft_spec.model_type, draft_config)


def measured_device(sidecar: dict) -> Hardware:
    """The measured roofline of the device that ran a ``moesd sweep``, usable in the sweep's weight dtype.

    :func:`measuring_hardware` reads the record from the sidecar; its GEMM peak
    was measured in the sweep's dtype, so for a float32 sweep it is also the record's fp32 peak
    (the record's ``peak_flops`` slot otherwise means bf16).

    Raises
    ------
    ValueError
        If the sidecar holds no measured roofline.
    """
    hardware = measuring_hardware(sidecar)
    measured_dtype = sidecar.get("roofline_measurement", {}).get("settings", {}).get("dtype")
    if measured_dtype == "float32" and hardware.fp32_flops is None:
        hardware = dataclasses.replace(hardware, fp32_flops=hardware.peak_flops)
    return hardware


def ridge_point_for(sidecar: dict) -> float:
    """Ridge point (FLOP/byte) of the device that produced a result file, from its measured roofline."""
    return measuring_hardware(sidecar).ridge_point


def ridge_tokens_for(sidecar: dict) -> float:
    """Ridge point in tokens of the device that produced a result file: where Algorithm 1's G turns linear.

    A weight of ``b`` bytes does 2 FLOP per token it meets (a multiply and an add), so a GEMM over ``t``
    tokens performs ``2 t / b`` FLOP per byte of weights read and reaches the ridge point ``RP``
    (FLOP/byte, :func:`ridge_point_for`) at ``t = RP b / 2`` tokens. For bf16 weights (``b = 2``) that
    is ``RP`` itself, as the paper uses it; for float32 it is ``2 RP``. ``b`` comes from the sweep's
    dtype (``settings.dtype``, else the dtype its roofline was measured in).

    Returns
    -------
    float
        Tokens (per GEMM: tokens of a dense layer, tokens per expert of an expert's).

    Raises
    ------
    ValueError
        If the sidecar holds no measured roofline, names no dtype, a dtype moesd does not know, or
        two different dtypes for the sweep and its roofline.
    """
    return ridge_point_for(sidecar) * bytes_per_weight(sidecar, "the ridge point in tokens") / 2


def bytes_per_weight(sidecar: dict, purpose: str) -> float:
    """Bytes per weight of a sweep's dtype (``settings.dtype``, else its roofline's).

    Parameters
    ----------
    sidecar : dict
        The sweep's sidecar.
    purpose : str
        What needs the bytes, for the error message.

    Returns
    -------
    float
        Bytes per weight (:data:`moesd.predictor.layout.DTYPE_BYTES`).

    Raises
    ------
    ValueError
        If the sidecar names no dtype, one moesd does not know, or two different ones for the sweep and its
        roofline.
    """
    from moesd.predictor.layout import DTYPE_BYTES, check_dtype

    dtypes = {check_dtype(dtype) for dtype in (sidecar.get("settings", {}).get("dtype"),
                                                 sidecar.get("roofline_measurement", {}).get("settings", {})
                                                 .get("dtype")) if dtype is not None}
    if len(dtypes) != 1:
        raise ValueError("the sidecar names " + (f"two dtypes ({', '.join(sorted(dtypes))}) for the sweep and its "
                                                 "roofline" if dtypes else "no dtype (settings.dtype)")
                         + f": {purpose} needs the bytes per weight")
    return DTYPE_BYTES[dtypes.pop()]


def rise_split(terms: pd.DataFrame) -> pd.DataFrame:
    """How Eq. 4's terms change from the smallest batch size to the peak of the mean speedup.

    A rise of the speedup is a larger ``tokens_per_round`` or a smaller denominator (a round's cost
    in decode steps); the denominator's fall is the sum of the falls of its terms, so each term's
    *share* of it says where the rise comes from (shares sum to 1; a term that grew has a negative
    share).

    Parameters
    ----------
    terms : pandas.DataFrame
        :func:`moesd.measure.analysis.eq4_terms` indexed by ``batch_size`` alone or by a group and ``batch_size`` (last level).

    Returns
    -------
    pandas.DataFrame
        One row per group (one row, index ``"all"``, without a group): ``first_batch_size``,
        ``peak_batch_size``, ``speedup_first``, ``speedup_peak``, ``yield_change`` (relative change of
        ``tokens_per_round``), ``denominator_fall`` (decode steps) and ``verify_share``,
        ``draft_share``, ``reject_share`` (dimensionless).
    """
    groups = (terms.groupby(level=list(range(terms.index.nlevels - 1))) if terms.index.nlevels > 1
              else [("all", terms)])
    rows = {}
    for key, part in groups:
        part = part.droplevel(list(range(part.index.nlevels - 1))) if part.index.nlevels > 1 else part
        part = part.sort_index()
        first, peak = part.iloc[0], part.loc[part["speedup"].idxmax()]
        fall = first["denominator"] - peak["denominator"]
        rows[key[0] if isinstance(key, tuple) and len(key) == 1 else key] = {
            "first_batch_size": part.index[0], "peak_batch_size": part["speedup"].idxmax(),
            "speedup_first": first["speedup"], "speedup_peak": peak["speedup"],
            "yield_change": peak["tokens_per_round"] / first["tokens_per_round"] - 1,
            "denominator_fall": fall,
            **{f"{name}_share": (first[name] - peak[name]) / fall if fall else float("nan")
               for name in ("verify", "draft", "reject")}}
    return pd.DataFrame.from_dict(rows, orient="index")
