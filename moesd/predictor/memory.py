"""Whether a deployment fits its GPUs' memory: weights and KV cache per GPU (beyond the paper).

:func:`memory_per_gpu` counts what each of a model's GPUs holds, as :func:`moesd.predictor.forward.step_time`
splits it; :func:`memory_fit` checks target and draft of a :class:`~moesd.predictor.setup.Setup` against their
GPUs at each batch size. Activations, the serving engine's workspace and fragmentation are not counted: a setup
above the GPU's memory does not fit, one just below may not either.

Pure numpy; no torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd.predictor.layout import check_dtype, check_parallelism, kv_cache_bytes, weights_per_gpu
from moesd.predictor.models import resolve_model
from moesd.predictor.setup import Setup
from moesd.theory.roofline import hardware_record

__all__ = ["memory_per_gpu", "memory_fit"]


def memory_per_gpu(model, hardware, batch_size, context, tp=1, ep=1, dtype="bf16", dp_attention=False,
                   kv_dtype=None) -> np.ndarray:
    """Bytes each of the model's ``tp`` GPUs holds: its weights (:func:`weights_per_gpu`) and caches.

    The caches hold ``context`` tokens for each of ``batch_size`` sequences (:func:`kv_cache_bytes`: KV heads split
    over the GPUs as :func:`moesd.predictor.forward.step_time` splits them, values in ``kv_dtype``, default the
    activations'). With ``dp_attention`` each GPU holds all weights but the routed experts (``E / tp`` of those)
    and the whole cache of ``ceil(B / tp)`` sequences.

    Returns
    -------
    numpy.ndarray
        Bytes, broadcast over ``batch_size`` and ``context``.
    """
    arch, hardware = resolve_model(model), hardware_record(hardware)
    B = as_array("batch_size", batch_size, low=1, whole=True)
    context = as_array("context", context, low=0, whole=True)
    tp, _ = check_parallelism(arch, hardware, tp, ep, dp_attention)
    split, sequences = (1, -(-B // tp)) if dp_attention else (tp, B)
    return weights_per_gpu(arch, dtype, tp, dp_attention) + kv_cache_bytes(arch, sequences, context, split,
                                                                           check_dtype(dtype), kv_dtype)


def memory_fit(setup: Setup, batch_size, context=None) -> pd.DataFrame:
    """Whether target and draft fit their GPUs' memory at each batch size.

    The target's weights and KV cache (in ``Setup.kv_dtype``) on each of its ``tp`` GPUs, and the draft's on each of its GPUs
    (:func:`memory_per_gpu`), each against its own GPU's memory, as :func:`moesd.predictor.predict.predict_sd`
    places them. A draft on the target's GPUs adds its weights and KV cache to theirs: a draft head on all of the
    target's GPUs and hardware always is there, as serving engines run MTP modules and EAGLE heads; any other
    draft is with ``Setup.shared``.

    Parameters
    ----------
    setup : Setup
        The deployment.
    batch_size : array_like
        Sequences ``B`` (>= 1).
    context : array_like, optional
        Tokens in each sequence's KV cache (>= 0), broadcast against ``batch_size`` (default: the setup's).

    Returns
    -------
    pandas.DataFrame
        One row per broadcast ``(batch_size, context)``: ``target_bytes``, what each of the target's GPUs
        holds (a draft on them included), and ``draft_bytes``, the draft's weights and KV cache per GPU of its
        own (bytes), and ``fits``: each at most its GPU's memory.
    """
    B, context = np.broadcast_arrays(as_array("batch_size", batch_size, low=1, whole=True),
                                     as_array("context", setup.context if context is None else context, low=0,
                                              whole=True))
    hardware, device = setup.hardware, setup.draft_device
    target_bytes = memory_per_gpu(setup.target, hardware, B, context, setup.tp, setup.ep, setup.dtype,
                                  setup.dp_attention, setup.kv_dtype)
    draft_bytes = memory_per_gpu(setup.draft, device, B, context, setup.draft_gpus, setup.draft_ep,
                                 setup.draft_weights, setup.draft_dp_attention, setup.kv_dtype)
    if setup.shared or (setup.head and setup.draft_gpus == setup.tp and device == hardware):
        target_bytes = target_bytes + draft_bytes
    fits = (target_bytes <= hardware.memory_bytes) & (draft_bytes <= device.memory_bytes)
    return pd.DataFrame({"batch_size": B.ravel(), "context": context.ravel(), "target_bytes": np.ravel(target_bytes),
                         "draft_bytes": np.ravel(draft_bytes), "fits": np.ravel(fits)}
                        ).astype({"batch_size": int, "context": int})


def rows_that_fit(frame: pd.DataFrame, setup: Setup) -> pd.DataFrame:
    """The rows of a :func:`moesd.predictor.predict.predict_sd` frame whose batch size and context fit the setup's
    target and draft in memory (:func:`memory_fit`; a draft on the target's GPUs shares them), in their order."""
    fit = memory_fit(setup, frame["batch_size"], frame["context"])
    return frame[fit["fits"].to_numpy()]
