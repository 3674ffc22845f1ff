"""Is a study in the paper's regime? The share of a decode step that is weight streaming.

The paper's mechanism (verification is cheap once a batch has loaded every expert, and each expert
stays memory-bound) is about steps whose time is mostly reading weights. A study tests it only if
its target step is: :func:`streaming_share` divides the bytes a ``B = 1`` target step must read (the
weights it uses, from :func:`moesd.predict.step_time`'s byte count for the sweep's model, Eq. 8's
experts, its KV cache) by the measured bandwidth of the measuring device (the sweep's sidecar), and
that time by the measured step. A share near 1 is a memory-bound step, the paper's regime; a share
of 0.1 is a step spent on something else (per-kernel launch cost, per-expert dispatch).
"""

from __future__ import annotations

from dataclasses import dataclass

from moesd.calibrate import measured_shapes
from moesd.measurements import measuring_hardware
from moesd.predict import step_time

_STEP_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16"}
"""The predictor's weight dtype for a sweep's dtype (two bytes for both half-precision types)."""


@dataclass(frozen=True)
class StreamingShare:
    """The streaming share of one measured target step.

    Attributes
    ----------
    share : float
        ``bytes / bandwidth / step_seconds``: the part of the step that reading its bytes at the
        measured bandwidth accounts for (1: memory-bound; may exceed 1 where caches serve reads).
    bytes : float
        Bytes the step reads: weights it uses, KV cache, logits' weights (bytes).
    bandwidth : float
        The device's measured STREAM bandwidth (bytes/s).
    step_seconds : float
        The measured step (s).
    """

    share: float
    bytes: float
    bandwidth: float
    step_seconds: float

    def as_dict(self) -> dict:
        """Plain values, as a sidecar stores them (``streaming_share``)."""
        return {"share": self.share, "bytes": self.bytes, "bandwidth": self.bandwidth,
                "step_seconds": self.step_seconds}


def step_bytes(sidecar: dict, batch_size: int = 1, tokens: int = 1) -> float:
    """Bytes one target forward of a sweep reads (weights used, KV cache), from its sidecar's shapes.

    Parameters
    ----------
    sidecar : dict
        A result file's sidecar (``settings``: target, draft, layers, draft_layers, width, dtype,
        context, the K of the pass via ``top_ks`` or the checkpoint's).
    batch_size, tokens : int
        B and the new tokens per sequence s of the forward.

    Returns
    -------
    float
        Bytes.
    """
    settings = sidecar.get("settings", {})
    target, _ = measured_shapes(sidecar)
    dtype = _STEP_DTYPES.get(settings.get("dtype", "float32"))
    if dtype is None:
        raise ValueError(f"sidecar: no step byte count for dtype {settings.get('dtype')!r}")
    step = step_time(target, "H200", tokens, batch_size, context=settings.get("context", 0), dtype=dtype)
    return float(sum(float(value) for value in step.bytes.values()))


def streaming_share(sidecar: dict, step_seconds: float, batch_size: int = 1, tokens: int = 1) -> StreamingShare:
    """The share of a measured target step that reading its bytes at the measured bandwidth accounts for.

    Parameters
    ----------
    sidecar : dict
        The sweep's sidecar: its shapes (:func:`step_bytes`) and measured roofline (``hardware``).
    step_seconds : float
        The measured target step, e.g. the median ``T_T(1, 1)`` of a forward study (s, > 0).
    batch_size, tokens : int
        The step's B and s (default a ``B = 1`` decode step).

    Returns
    -------
    StreamingShare
    """
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    bandwidth = measuring_hardware(sidecar).memory_bandwidth
    moved = step_bytes(sidecar, batch_size, tokens)
    return StreamingShare(share=moved / bandwidth / step_seconds, bytes=moved, bandwidth=bandwidth,
                          step_seconds=float(step_seconds))
