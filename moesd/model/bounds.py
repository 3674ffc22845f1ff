"""The bounds of Appendix C.2 on Algorithm 1's parameters (:data:`moesd.model.algorithm1.PARAMETERS`).

A decode step cannot take less time than reading its weights at the hardware's peak bandwidth: the target's
dense part, one expert of every MoE layer and the whole draft set lower bounds on ``bias``, ``k2`` and
``draft_bias``, and five times those the upper bounds: :func:`parameter_bounds` for given models and hardware,
:func:`appendix_c2_bounds` for the models and machine of a result file. Pure numpy and pandas: with a model, the
parameters are counted through :mod:`moesd.zoo`, which imports torch only then.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd._checks import UsageError, as_array
from moesd.measure.analysis import bytes_per_weight, measuring_hardware
from moesd.theory.roofline import hardware_record


def _unread_parameters(model, layers: int | None, width: float, vocab_size: int | None) -> int:
    """Parameters of ``model`` that :meth:`moesd.zoo.ModelSpec.parameter_counts` counts but a decode step does not
    read, counted analytically (no torch).

    Two parts, for the model cut to ``layers`` and ``width`` as a sweep builds it:

    * with ``vocab_size``, the embedding rows and LM-head columns a vocabulary cut to that many tokens drops
      (as a sweep cuts it, :func:`moesd.zoo.depth_scaled_vocab`): ``2 (V - v) d`` untied, ``(V - v) d`` tied;
    * the input token-embedding table of ``v`` rows when it is not the LM head (untied): a step gathers the
      B rows of its tokens, while it reads the head (``v x d``, the same shape) whole. Tied, the table is the
      head and is read. (OPT's learned position table is gathered too, but stays counted: 2050 x 1024
      values, 0.6% of OPT-350M's parameters.)

    So an untied model reads ``dense - V d - (V - v) d``: of the cut, only the head's part matters.
    """
    from moesd.architecture import Architecture

    config = model.config_dict(layers, width=width)
    whole = Architecture.from_config(model.name, model.model_type, config)
    built = whole if vocab_size is None else Architecture.from_config(model.name, model.model_type,
                                                                      {**config, "vocab_size": vocab_size})
    cut = whole.weight_counts()["total"] - built.weight_counts()["total"]
    gathered = 0 if built.tied_embeddings else built.head_params
    return int(cut + gathered)


def parameter_bounds(model=None, hardware=None, draft=None, bytes_per_parameter: float = 2.0,
                     t_reject: float | None = None, layers: int | None = None, draft_layers: int | None = None,
                     width: float = 1.0, vocab_size: int | None = None, tp: int = 1,
                     draft_tp: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of Appendix C.2 as (lower, upper) arrays in :data:`~moesd.model.algorithm1.PARAMETERS` order.

    With a target ``model`` (a :class:`moesd.zoo.ModelSpec`), a ``draft`` and ``hardware`` (a
    :class:`moesd.theory.roofline.Hardware` or its name), ``bias``, ``k2`` and ``draft_bias`` lie between
    the time one GPU takes to read its share of their parameters at peak bandwidth and 5 times that
    (seconds): the target's dense part, one expert of every MoE layer, the whole draft. A decode step
    reads every weight but the input embedding table, of which it gathers B rows: an untied table is left
    out (the LM head is read whole; tied, the table is the head and stays). The target runs on ``tp``
    GPUs, each reading ``1 / tp`` of the dense part and of every expert at once, the draft on its own
    ``draft_tp`` GPUs (each reading ``1 / draft_tp`` of it); what tensor parallelism replicates (norms,
    routers) is taken as split too, so the lower bounds stay lower bounds. ``layers``,
    ``draft_layers`` and ``width`` count the parameters of a model cut to that many layers and scaled in
    width, as the sweeps build it (:meth:`moesd.zoo.ModelSpec.parameter_counts`; default: the whole
    model), and ``vocab_size`` counts the embeddings and LM head of both models with a vocabulary cut to
    that many tokens (a sweep's ``settings.vocab_size``; the draft shares the target's vocabulary).
    ``t_reject`` (the largest measured rejection time, seconds) caps ``reject_bias`` and ``reject_k``.
    Without them those bounds are [0, inf). ``lam`` is in [0.2, 1] and ``s`` in [1, 2] always; ``k1`` is
    kept above 0 (G's growth would vanish).

    Parameters
    ----------
    model, draft : moesd.zoo.ModelSpec, optional
        Target and draft (the draft needs the target).
    hardware : Hardware or str, optional
        The device (with ``model``); its ``memory_bandwidth`` in bytes/s sets the volume bounds.
    bytes_per_parameter : float, default 2.0
        Bytes per weight (2 for bf16, 4 for float32).
    t_reject : float, optional
        Largest measured rejection time (seconds, > 0).
    layers, draft_layers : int, optional
        Decoder layers the sweep kept of the target and of the draft (default: all).
    width : float, default 1.0
        Width factor of both models, in (0, 1].
    vocab_size : int, optional
        The vocabulary both models were cut to (tokens).
    tp, draft_tp : int, default 1
        Tensor-parallel GPUs of the target and of the draft (whole numbers >= 1; CPU sweeps: 1).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        ``(lower, upper)`` in :data:`~moesd.model.algorithm1.PARAMETERS` order, seconds for the time-like parameters.
    """
    if (model is None) != (hardware is None):
        raise UsageError("model and hardware must be given together (the volume bounds need both)", "model")
    if draft is not None and model is None:
        raise UsageError("draft bounds need model and hardware too", "draft")
    if vocab_size is not None and model is None:
        raise UsageError("vocab_size applies to the volume bounds: give model and hardware too", "vocab_size")
    bytes_per_parameter = float(as_array("bytes_per_parameter", bytes_per_parameter, low=0, low_open=True))
    tp = int(as_array("tp", tp, low=1, whole=True))
    draft_tp = int(as_array("draft_tp", draft_tp, low=1, whole=True))
    if (tp, draft_tp) != (1, 1) and model is None:
        raise UsageError("tp and draft_tp apply to the volume bounds: give model and hardware too", "tp")
    lower = np.array([0, 1e-12, 0, 0, 0, 0, 0, 0, 0.2, 1.0])
    upper = np.array([np.inf] * 8 + [1.0, 2.0])
    if model is not None:
        hardware = hardware_record(hardware)
        counts = model.parameter_counts(num_layers=layers, width=width)
        seconds = bytes_per_parameter / hardware.memory_bandwidth
        if vocab_size is not None:
            vocab_size = int(as_array("vocab_size", vocab_size, low=1, whole=True))
        unread = _unread_parameters(model, layers, width, vocab_size)
        lower[0] = (counts["dense"] - unread) / tp * seconds
        lower[2] = counts["experts"] / model.num_experts / tp * seconds
        if draft is not None:
            draft_unread = _unread_parameters(draft, draft_layers, width, vocab_size)
            draft_total = draft.parameter_counts(num_layers=draft_layers, width=width)["total"]
            lower[4] = (draft_total - draft_unread) / draft_tp * seconds
        for index in (0, 2, 4):
            upper[index] = 5 * lower[index] if lower[index] > 0 else np.inf
    if t_reject is not None:
        upper[6] = upper[7] = float(as_array("t_reject", t_reject, low=0, low_open=True))
    return lower, upper


def appendix_c2_bounds(rows: pd.DataFrame, sidecar: dict) -> tuple[np.ndarray, np.ndarray]:
    """Appendix C.2's bounds of Algorithm 1 for the models and machine of a result file.

    ``bias``, ``k2`` and ``draft_bias`` lie between the time to read the dense parameters, one
    expert of every MoE layer and the whole draft at the machine's measured bandwidth
    (:func:`moesd.measure.analysis.measuring_hardware`) and 5 times that, counting the parameters of the
    models as the sweep built them (its layers, width and vocabulary, ``settings``) at the bytes of its dtype, each model's
    volume split over its tensor-parallel GPUs as the sidecar records them (a vLLM file's
    ``tensor_parallel_size`` and ``draft_tensor_parallel_size``; files without them, as
    :mod:`moesd.measure.bench` writes on one device, ran on one); ``reject_bias`` and ``reject_k`` lie below
    the largest measured rejection time (``rows["t_reject"]``, seconds). See :func:`parameter_bounds`.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        ``(lower, upper)`` in :data:`moesd.model.algorithm1.PARAMETERS` order (seconds for the time-like ones).
    """
    from moesd.zoo import get_model

    settings = sidecar.get("settings", {})
    missing = [f"settings.{key}" for key in ("target", "draft") if not settings.get(key)]
    missing += ["a t_reject column"] if "t_reject" not in rows.columns else []
    if missing:
        raise ValueError(f"the bounds need the models and the rejection times; the file has no {', '.join(missing)}")
    if settings.get("target_path") or settings.get("draft_path"):
        raise ValueError("the bounds count the parameters of moesd.zoo's models; this file measured models "
                         "loaded from a path")
    return parameter_bounds(get_model(settings["target"]), measuring_hardware(sidecar), get_model(settings["draft"]),
                            bytes_per_weight(sidecar, "the volume bounds"), float(rows["t_reject"].max()),
                            layers=settings.get("layers"), draft_layers=settings.get("draft_layers"),
                            width=settings.get("width") or 1.0, vocab_size=settings.get("vocab_size"),
                            tp=sidecar.get("tensor_parallel_size") or 1,
                            draft_tp=sidecar.get("draft_tensor_parallel_size") or 1)
