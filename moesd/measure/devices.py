"""What this machine's torch can run on: its build (CPU, CUDA or ROCm) and the GPUs it sees.

``moesd hardware`` prints it under the hardware records, so that a reader with a GPU can check that the venv's
torch is a GPU build (``make gpu``) and sees the GPU before starting a study with ``--device cuda``. Each GPU is
matched to the record of :data:`moesd.theory.roofline.HARDWARE` its name names (the data-sheet ridge point, Eq. 1)
and to the folder its results go to (:func:`moesd.measure.sweeps.gpu_label`).

torch is imported inside :func:`local_devices`; without torch the report says so.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from moesd.theory.roofline import HARDWARE


@dataclass(frozen=True)
class Gpu:
    """One GPU as torch sees it.

    Attributes
    ----------
    index : int
        Its CUDA index (``cuda:index``).
    name : str
        The name the driver reports (``NVIDIA H100 80GB HBM3``).
    memory_bytes : float
        Its memory, bytes.
    capability : tuple of int
        CUDA compute capability (major, minor): (9, 0) for Hopper, (8, 0) for A100.
    record : str or None
        The key of the :data:`moesd.theory.roofline.HARDWARE` record its name names, ``None`` if none does.
    folder : str
        The folder of ``data/measurements/`` its results go to (:func:`moesd.measure.sweeps.gpu_label`).
    """

    index: int
    name: str
    memory_bytes: float
    capability: tuple[int, int]
    record: str | None
    folder: str


@dataclass(frozen=True)
class LocalDevices:
    """The torch of this Python and the GPUs it sees.

    Attributes
    ----------
    torch : str or None
        torch's version (``2.13.0+cpu``), ``None`` where torch is not installed.
    cuda : str or None
        The CUDA version torch was built for (``torch.version.cuda``); ``None`` for a CPU or ROCm build.
    hip : str or None
        The ROCm (HIP) version of a ROCm build, else ``None``.
    gpus : tuple of Gpu
        The GPUs torch can use (none on a CPU build, or where the driver is missing or too old).
    unavailable : str or None
        Why a GPU build sees no GPU: what torch said while looking and on ``torch.cuda.init()`` (no driver, a
        driver too old for the build, no visible device); ``None`` for a CPU build or where it sees one.
    """

    torch: str | None
    cuda: str | None
    hip: str | None
    gpus: tuple[Gpu, ...]
    unavailable: str | None

    @property
    def build(self) -> str:
        """``CUDA 13.0``, ``ROCm 6.4``, ``CPU`` or ``none`` (no torch)."""
        if self.torch is None:
            return "none"
        if self.cuda:
            return f"CUDA {self.cuda}"
        return f"ROCm {self.hip}" if self.hip else "CPU"


def matching_record(name: str, memory_bytes: float) -> str | None:
    """The :data:`~moesd.theory.roofline.HARDWARE` record a GPU's name names, ``None`` if none.

    A record matches where its name (before a ``-`` variant suffix) stands in the GPU's name as a whole word
    (``H20`` is not ``H200``); of several (``H20`` and ``H20-141GB``), the one whose memory is nearest.

    Parameters
    ----------
    name : str
        The GPU's name as the driver reports it.
    memory_bytes : float
        Its memory, bytes.
    """
    upper = name.upper()
    matches = [key for key, record in HARDWARE.items() if record.name != "CPU"
               and re.search(rf"(?<![A-Z0-9]){re.escape(key.split('-')[0].upper())}(?![A-Z0-9])", upper)]
    if not matches:
        return None
    return min(matches, key=lambda key: abs(HARDWARE[key].memory_bytes - memory_bytes))


def local_devices() -> LocalDevices:
    """The torch of this Python, its build and the GPUs it sees (no GPU work beyond asking the driver)."""
    try:
        import torch
    except ImportError:
        return LocalDevices(torch=None, cuda=None, hip=None, gpus=(), unavailable=None)
    from moesd.measure.sweeps import gpu_label

    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    if not (cuda or hip):
        return LocalDevices(torch=torch.__version__, cuda=None, hip=None, gpus=(), unavailable=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    gpus = []
    for index in range(torch.cuda.device_count() if available else 0):
        properties = torch.cuda.get_device_properties(index)
        gpus.append(Gpu(index=index, name=properties.name, memory_bytes=float(properties.total_memory),
                        capability=(properties.major, properties.minor),
                        record=matching_record(properties.name, properties.total_memory),
                        folder=gpu_label(properties.name)))
    reasons = [str(w.message) for w in caught]
    if not gpus:
        try:
            torch.cuda.init()  # raises saying why: no driver, a driver too old for the build, no visible device
        except Exception as error:  # noqa: BLE001 - whatever torch raises, its message is the report
            reasons.append(str(error))
    reasons = "; ".join(dict.fromkeys(" ".join(reason.split()) for reason in reasons))
    return LocalDevices(torch=torch.__version__, cuda=cuda, hip=hip, gpus=tuple(gpus),
                        unavailable=None if gpus else (reasons or "torch.cuda.is_available() is False"))
