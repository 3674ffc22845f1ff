"""The project's presets of every study, and how a sweep of real shapes fits a device.

:func:`preset` (and :func:`preset_settings`, :func:`with_overrides`) give the settings the project
measures with: ``"cpu"``, the paper's regime on a 2-core CPU (real widths cut in depth only), and
``"gpu"``, the real shapes on one CUDA device. :func:`layers_that_fit` and
:func:`proportional_draft_layers` cut a target too large for a device, and its draft in the same
proportion. The presets are data, ``records/presets.toml`` (:data:`PRESETS`). Pure Python: settings are
checked by :class:`moesd.measure.sweeps.SweepConfig` without importing torch; what a preset costs is estimated by :func:`moesd.measure.sweeps.estimate_seconds`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from moesd._checks import UsageError, as_array
from moesd.measure.sweeps import STUDIES, SweepConfig, checked_model, whole_number

PRESETS_TABLE = Path(__file__).resolve().parents[1] / "records" / "presets.toml"
"""The data table of the presets: one table per preset and study, and the paper's pairs."""

DERIVED = {"draft_layers": "proportional", "vocab_size": "depth-scaled"}
"""Settings a preset table may leave to be derived from its target and layers, with the word that says so."""


def load_presets(path=None) -> tuple[dict, dict]:
    """The presets of a table (default :data:`PRESETS_TABLE`): ``{preset: {study: settings}}``, and the pairs.

    Arrays become tuples, as :class:`SweepConfig` keeps them; the derived settings (:data:`DERIVED`) keep their
    word until :func:`preset_settings` resolves them.

    Raises
    ------
    ValueError
        A preset without every study of :data:`STUDIES`, a setting :class:`SweepConfig` does not have, or a
        derived setting with another word.
    """
    path = Path(path) if path is not None else PRESETS_TABLE
    with open(path, "rb") as file:
        table = tomllib.load(file)
    pairs = table.pop("pairs")
    fields = {field.name for field in dataclasses.fields(SweepConfig)} - {"study"}
    presets = {}
    for name, studies in table.items():
        if set(studies) != set(STUDIES):
            raise ValueError(f"{path}: preset {name!r} must have the studies {', '.join(STUDIES)}")
        for study, settings in studies.items():
            unknown = sorted(set(settings) - fields)
            wrong = [key for key, word in DERIVED.items() if isinstance(settings.get(key), str)
                     and settings[key] != word]
            if unknown or wrong:
                raise ValueError(f"{path}: [{name}.{study}] has unknown or mis-derived setting(s) {unknown + wrong}")
        presets[name] = {study: {"study": study, **{key: tuple(value) if isinstance(value, list) else value
                                                     for key, value in settings.items()}}
                         for study, settings in studies.items()}
    return presets, pairs


PRESETS, PAIRS = load_presets()
"""The project's presets by name and study (``records/presets.toml``), and the paper's target and draft pairs (MoE
and dense), as the presets measure them."""


def preset_settings(study: str, name: str = "cpu") -> dict:
    """The keyword arguments of :func:`preset` (for callers that change some before building a config): the row of
    :data:`PRESETS`, its derived settings (:data:`DERIVED`) computed from its target and layers."""
    if name not in PRESETS:
        raise UsageError(f"preset must be {' or '.join(repr(n) for n in PRESETS)}, got {name!r}")
    if study not in STUDIES:
        raise UsageError(f"study must be one of {', '.join(STUDIES)}, got {study!r}")
    settings = dict(PRESETS[name][study])
    if settings.get("draft_layers") == DERIVED["draft_layers"]:
        settings["draft_layers"] = proportional_draft_layers(settings["target"], settings["draft"],
                                                             settings["layers"])
    if settings.get("vocab_size") == DERIVED["vocab_size"]:
        from moesd.zoo import depth_scaled_vocab

        settings["vocab_size"] = depth_scaled_vocab(settings["target"], settings["layers"])
    return settings


def with_overrides(study: str, name: str, given: dict) -> dict:
    """A preset's settings with ``given`` ones in place, the settings a preset derives kept consistent.

    The CPU preset derives the draft's depth (:func:`proportional_draft_layers`) and the vocabulary
    (:func:`moesd.zoo.depth_scaled_vocab`) from its target and the target's layers: when ``given``
    changes the target or its layers (and not the derived setting itself), they follow. With
    pretrained weights the preset's shape settings are dropped (a checkpoint keeps its shape).

    Returns
    -------
    dict
        Keyword arguments of :class:`SweepConfig` (checked when the config is built).
    """
    from moesd.zoo import depth_scaled_vocab

    settings = {**preset_settings(study, name), **given}
    if settings.get("weights") == "pretrained":
        for key in ("layers", "draft_layers", "vocab_size"):
            if key not in given:
                settings[key] = None
        if "width" not in given:
            settings["width"] = 1.0
        return settings
    derives = any(PRESETS[name][study].get(key) == word for key, word in DERIVED.items())
    if derives and ({"target", "layers", "draft"} & set(given)):
        try:
            target = checked_model(settings["target"], "target")
            checked_model(settings["draft"], "draft")
            layers = whole_number("layers", settings["layers"] or target.num_layers, 1, target.num_layers)
        except UsageError:
            return settings  # SweepConfig names the bad setting
        if "vocab_size" not in given:
            settings["vocab_size"] = depth_scaled_vocab(target.name, layers)
        if "draft_layers" not in given:
            settings["draft_layers"] = proportional_draft_layers(target.name, settings["draft"], layers)
    return settings


def preset(study: str, name: str = "cpu") -> SweepConfig:
    """The project's settings of a study.

    ``"cpu"``: the paper's regime on a 2-core CPU (the regime check: ``moesd hardware --regime``).
    Real widths, cut in depth only: one layer of Qwen2-57B-A14B with one of Qwen2-0.5B, one of
    OPT-30b with one of OPT-350m, the vocabulary cut by the same factor
    (:func:`moesd.zoo.depth_scaled_vocab`) so that the LM head keeps its share of a step; random bf16
    weights (no one-token kernel jump, a GPU-like roofline, half the bytes of float32); uniform
    routing for the MoE (Eq. 8's assumption; ``routing``); 5 repeats, interleaved; synthetic
    acceptance at the paper's sigma. A real-width layer makes a B = 100 verification take about two
    seconds, so the end-to-end studies keep few rounds and some of the paper's batch sizes, each sized
    by :func:`moesd.measure.sweeps.estimate_seconds` from the forward study to at most 15 minutes of the
    idle machine with 2 torch threads (measured on 2026-11-26):

    * ``forward``, ``dense_forward``: the paper's 19 batch sizes, s = 1 ... 5 over an 8-token cache
      (6.4 and 4.6 minutes).
    * ``e2e``, ``dense``: B = 1, 2, 4, 8, 12, 16, 24, 32, 48, 100 x gamma 2, 3, 4, 5 timed rounds after one warm-up
      round, 4-token prompts (12.6 and 8.5 minutes).
    * ``sparsity``: K = 1, 2, 4, 8 x gamma 2, 4 x B = 1, 4, 8, 16, 32, 100, 3 timed rounds, 2-token
      prompts (11.3 minutes).
    * ``settings``: Fig. 5's four workloads (HumanEval and MT-bench at temperatures 0 and 1, sigma
      from the paper's Table 1 on 2xA800) at gamma = 4 over B = 1, 8, 24, 48, 100, 4 timed rounds
      (8.8 minutes). The workloads differ only in sigma: sampling at temperature 1 is not emulated.

    ``"gpu"``: the real shapes in bf16 on CUDA with random weights (Qwen2-57B-A14B needs about
    115 GB: it fits one H200; pass ``layers`` for a smaller GPU) and 64-token prompts, for one
    10-minute call of a 15-minute GPU lease (``tools/gpu_run.py``): the forward studies over the
    paper's 19 batch sizes with 5 repeats (on an H200 about 90 s each as CUDA graph replays, 70 s
    eagerly); the end-to-end studies over B = 1, 4, 8, 16, 24, 32, 48, 60, 80, 100 (10 of the paper's,
    spread over 1-100) with 8 timed rounds after one warm-up round and 2 repeats; the sparsity study at K = 1, 2,
    4, 8 and gamma 2, 4 over B = 1, 8, 24, 48, 100, one repeat. The engine runs eagerly: on the H200
    a point of the end-to-end study took about 22 s with 24 rounds (so 5 of 20 points fit the 140 s
    its stage had), about 8 s with these 8.
    """
    return SweepConfig(**preset_settings(study, name))


def layers_that_fit(target: str, draft: str, memory_bytes: float, bytes_per_parameter: float = 2.0,
                    share: float = 0.8, cached_tokens: int = 0) -> int:
    """The most target layers whose weights and KV cache, with the whole draft's, fit a share of a device's memory.

    For a GPU sweep of real shapes with random weights on a GPU too small for the whole target (an
    80 GB H100 holds about half of Qwen2-57B-A14B's layers in bf16): pass the result as ``layers``.
    The rest of the memory is left to activations and logits (hundreds of MB at the presets' batch
    sizes) and to the allocator's slack.

    Parameters
    ----------
    target, draft : str
        :mod:`moesd.zoo` names.
    memory_bytes : float
        Device memory available (bytes), e.g. the free memory ``torch.cuda.mem_get_info`` reports.
    bytes_per_parameter : float
        Bytes per weight and per cached value: 2 for bf16 and fp16, 4 for float32.
    share : float
        Share of ``memory_bytes`` that weights and caches may take, in (0, 1].
    cached_tokens : int
        Token positions each model's KV cache holds at once, summed over sequences
        (:func:`moesd.measure.sweep_memory.cached_tokens` of the sweep); 0 counts the weights only.

    Returns
    -------
    int
        Layers, from 1 to the target's full depth.

    Raises
    ------
    UsageError
        If not even one target layer fits, or an argument is out of range.
    """
    target_spec, draft_spec = checked_model(target, "target"), checked_model(draft, "draft")
    memory_bytes = float(as_array("memory_bytes", memory_bytes, low=0, low_open=True))
    bytes_per_parameter = float(as_array("bytes_per_parameter", bytes_per_parameter, low=0, low_open=True))
    share = float(as_array("share", share, low=0, low_open=True, high=1))
    cached_tokens = whole_number("cached_tokens", cached_tokens, 0)

    def values(spec, layers=None):  # weights and cached values of a model with this many layers
        architecture = spec.architecture(num_layers=layers)
        return (spec.weight_counts(num_layers=layers)["total"]
                + architecture.kv_values_per_token * architecture.num_layers * cached_tokens)

    budget = share * memory_bytes / bytes_per_parameter - values(draft_spec)
    for layers in range(target_spec.architecture().num_layers, 0, -1):
        if values(target_spec, layers) <= budget:
            return layers
    needed = (values(target_spec, 1) + values(draft_spec)) * bytes_per_parameter
    raise UsageError(f"one layer of {target} and the whole {draft}, with {cached_tokens} cached tokens, need "
                     f"{needed / 1e9:.1f} GB, more than {share:g} of {memory_bytes / 1e9:.1f} GB")


def proportional_draft_layers(target: str, draft: str, layers: int) -> int:
    """Draft layers that keep the share of the draft's depth equal to the share ``layers`` keeps of the target's.

    When a GPU holds only part of the target (:func:`layers_that_fit`), a whole draft beside a
    half-depth target would cost the target twice what it costs at full depth and distort the draft
    term of Eq. 4; cutting both to the same share keeps their ratio of per-layer work.

    Parameters
    ----------
    target, draft : str
        :mod:`moesd.zoo` names.
    layers : int
        Target layers kept (1 to the target's depth).

    Returns
    -------
    int
        ``round(draft depth x layers / target depth)``, at least 1.
    """
    target_layers = checked_model(target, "target").num_layers
    draft_layers = checked_model(draft, "draft").num_layers
    layers = whole_number("layers", layers, 1, target_layers)
    return max(1, round(draft_layers * layers / target_layers))
