"""Trained routing the book ships: public routing data of real MoEs, selectable by name.

Each source is a folder of ``data/traces/`` holding the upstream licence (``LICENSE``), a provenance
``README.md`` (repository, commit, path of every file read, how it was produced), ``source.json`` (the same
facts, machine-readable, with the shape of every file) and the converted arrays as CSV. They were converted
once by ``tools/convert_routing_sources.py`` (upstream pickles read by :mod:`moesd.routing.pickles`, which
runs no code); this module reads only the CSVs and refuses a folder without a licence or a file whose
shape is not the one ``source.json`` (and the README) state (:class:`SourceShapeError`).

Shipped (see each README):

* ``allenai-olmoe`` (Apache-2.0): per-layer expert counts of OLMoE-1B-7B (E = 64, K = 8; pretrained, SFT and
  DPO checkpoints) and Mixtral-8x7B (E = 8, K = 2) at decoder layers 0, 7 and 15, over about 200k tokens of
  each of six text domains;
* ``specmoe-switch`` (MIT): per-layer top-1 counts of Switch-base-128 (E = 128, K = 1) at its six sparse encoder
  layers over 206,866 tokens per layer, and 12 sequences of up to 100 tokens routed token by token.

A source is named ``<model>/<domain>`` (:func:`names`: ``"olmoe/c4"``, ``"mixtral/github"``,
``"switch-base-128/mixed"``...). :func:`popularity` gives its per-layer expert popularity (the chance one
token picks each expert, summing to ``K``), optionally mapped onto a model's MoE layers, which is what
:func:`moesd.theory.experts.expected_active_experts_from_popularity`, :mod:`moesd.routing.loads`, the
predictor (``routing=<name>``) and the timed studies' ``popularity`` routing take.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moesd.routing.traces import RoutingTrace

REPOSITORY_TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
"""The repository's ``data/traces/``: where sources are read when ``$MOESD_DATA/traces`` holds none."""


class SourceShapeError(ValueError):
    """A shipped source's file is not what its ``source.json`` and README say (columns, rows, experts, layers, sums)."""


@dataclass(frozen=True)
class SourceInfo:
    """What one named source is and where it comes from.

    Attributes
    ----------
    name : str
        ``<model>/<domain>``.
    folder : pathlib.Path
        Its folder in ``data/traces/``.
    repository, commit, licence : str
        Upstream repository URL, the commit read, and the licence's SPDX id.
    checkpoint : str
        The Hugging Face checkpoint whose router was recorded.
    num_experts, top_k, num_layers : int
        E, K and the model's decoder layers.
    layers : tuple of int
        The model's layer index of each recorded MoE layer.
    domain : str
        The text the counts were taken on.
    tokens : int
        Tokens counted in each layer.
    """

    name: str
    folder: Path
    repository: str
    commit: str
    licence: str
    checkpoint: str
    num_experts: int
    top_k: int
    num_layers: int
    layers: tuple
    domain: str
    tokens: int

    def provenance(self, layer_map=None) -> dict:
        """JSON-ready provenance for a result's sidecar: source, repository, commit, licence, checkpoint, layers."""
        note = {"source": self.name, "repository": self.repository, "commit": self.commit, "licence": self.licence,
                "checkpoint": self.checkpoint, "source_layers": list(self.layers), "tokens_per_layer": self.tokens}
        if layer_map is not None:
            note["layers_mapped"] = [int(layer) for layer in layer_map]
        return note


def _folders() -> list[Path]:
    """Source folders (those with a ``source.json``) in ``$MOESD_DATA/traces``, else in the repository's."""
    data = os.environ.get("MOESD_DATA")  # read when called, as moesd.measure.studies does
    for base in ((Path(data) / "traces",) if data else ()) + (REPOSITORY_TRACES,):
        found = sorted(path.parent for path in base.glob("*/source.json"))
        if found:
            return found
    return []


def read_source(folder) -> tuple[dict, dict]:
    """A source folder's ``source.json`` and its CSV files, each checked against the shape it states.

    Parameters
    ----------
    folder : str or os.PathLike
        A folder of ``data/traces/``.

    Returns
    -------
    (dict, dict of str to pandas.DataFrame)
        The parsed ``source.json`` and every file it lists, by file name.

    Raises
    ------
    SourceShapeError
        Without ``LICENSE`` or ``source.json``, or if a file's columns, rows, models, domains, layers, experts
        or per-layer sums differ from what ``source.json`` states.
    """
    return _read_source(str(Path(folder).resolve()))


@functools.lru_cache(maxsize=8)
def _read_source(folder: str) -> tuple[dict, dict]:
    path = Path(folder)
    if not (path / "LICENSE").is_file():
        raise SourceShapeError(f"{path} has no LICENSE: data without a licence is never read")
    if not (path / "source.json").is_file():
        raise SourceShapeError(f"{path} has no source.json stating its files' shapes")
    source = json.loads((path / "source.json").read_text())
    frames = {}
    for name, shape in source["files"].items():
        try:
            frame = pd.read_csv(path / name)
        except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
            raise SourceShapeError(f"{path / name}: {error}") from None
        if list(frame.columns) != shape["columns"] or len(frame) != shape["rows"]:
            raise SourceShapeError(f"{path / name} has columns {list(frame.columns)} and {len(frame)} rows; "
                                   f"source.json states {shape['columns']} and {shape['rows']}")
        numeric = [c for c in ("layer", "expert", "count", "position", "sequence") if c in frame]
        if not all(pd.api.types.is_integer_dtype(frame[c]) for c in numeric) or (frame[numeric] < 0).any().any():
            raise SourceShapeError(f"{path / name}: {', '.join(numeric)} must be whole numbers >= 0")
        frames[name] = frame
    _check_counts(path, source, frames["expert_counts.csv"])
    if "token_routing.csv" in frames:
        _check_tokens(path, source, frames["token_routing.csv"])
    return source, frames


def _check_counts(path: Path, source: dict, counts: pd.DataFrame) -> None:
    """Every (model, domain, layer) of ``source.json`` holds experts 0..E-1 once and sums to tokens x K."""
    expected = {(model, domain, layer) for model, spec in source["models"].items() for domain in spec["domains"]
                for layer in spec["layers"]}
    found = set(counts.groupby(["model", "domain", "layer"]).groups)
    if found != expected:
        extra, missing = sorted(found - expected), sorted(expected - found)
        raise SourceShapeError(f"{path / 'expert_counts.csv'}: (model, domain, layer) groups differ from "
                               f"source.json: extra {extra[:3]}, missing {missing[:3]}")
    for (model, domain, layer), group in counts.groupby(["model", "domain", "layer"]):
        spec = source["models"][model]
        if sorted(group["expert"]) != list(range(spec["experts"])):
            raise SourceShapeError(f"{path / 'expert_counts.csv'}: {model}/{domain} layer {layer} does not list "
                                   f"experts 0..{spec['experts'] - 1} once each")
        if int(group["count"].sum()) != source["tokens"][f"{model}/{domain}"] * spec["top_k"]:
            raise SourceShapeError(f"{path / 'expert_counts.csv'}: {model}/{domain} layer {layer} counts "
                                   f"{int(group['count'].sum())} choices, not tokens x K = "
                                   f"{source['tokens'][f'{model}/{domain}']} x {spec['top_k']}")


def _check_tokens(path: Path, source: dict, tokens: pd.DataFrame) -> None:
    """Per-token sequences: the stated number, positions 0..n-1 in each, one layer each, ids below E."""
    (model, spec), = source["models"].items()
    shape = source["files"]["token_routing.csv"]
    sequences = tokens.groupby("sequence")
    positions_ok = all(np.array_equal(g["position"].to_numpy(), np.arange(len(g))) for _, g in sequences)
    if (sequences.ngroups != shape["sequences"] or not positions_ok or (sequences["layer"].nunique() != 1).any()
            or not tokens["layer"].isin(spec["layers"]).all() or (tokens["expert"] >= spec["experts"]).any()):
        raise SourceShapeError(f"{path / 'token_routing.csv'}: not {shape['sequences']} sequences of consecutive "
                               f"positions, each in one of the layers {spec['layers']}, with expert ids below "
                               f"{spec['experts']} ({model})")


def names() -> tuple[str, ...]:
    """Every shipped source's name, ``<model>/<domain>``, in folder order."""
    found = []
    for folder in _folders():
        source = read_source(folder)[0]
        found += [f"{model}/{domain}" for model, spec in source["models"].items() for domain in spec["domains"]]
    return tuple(found)


def info(name: str) -> SourceInfo:
    """The :class:`SourceInfo` of a source named ``<model>/<domain>`` (:func:`names`).

    Raises
    ------
    ValueError
        For a name no shipped source has, listing those that exist.
    """
    model, _, domain = str(name).partition("/")
    for folder in _folders():
        source = read_source(folder)[0]
        spec = source["models"].get(model)
        if spec is not None and domain in spec["domains"]:
            return SourceInfo(name=f"{model}/{domain}", folder=folder, repository=source["repository"],
                              commit=source["commit"], licence=source["licence"], checkpoint=spec["checkpoint"],
                              num_experts=spec["experts"], top_k=spec["top_k"], num_layers=spec["num_layers"],
                              layers=tuple(spec["layers"]), domain=domain, tokens=source["tokens"][f"{model}/{domain}"])
    raise ValueError(f"no shipped routing source is named {name!r}; the sources are {', '.join(names())}")


def expert_counts(name: str) -> pd.DataFrame:
    """Times each expert was chosen in each recorded layer of source ``name``: columns ``layer``, ``expert``, ``count``."""
    source = info(name)
    counts = read_source(source.folder)[1]["expert_counts.csv"]
    model, domain = source.name.split("/")
    chosen = counts[(counts["model"] == model) & (counts["domain"] == domain)]
    return chosen[["layer", "expert", "count"]].sort_values(["layer", "expert"]).reset_index(drop=True)


def layer_map(name: str, num_layers: int) -> np.ndarray:
    """Which recorded layer of source ``name`` each of ``num_layers`` MoE layers takes: layer ``i`` takes ``i mod n``.

    The same rule as a trace replay (:class:`moesd.measure.router_control.RoutingControl`): a one-layer
    model takes the first recorded layer.

    Returns
    -------
    numpy.ndarray of int, shape (num_layers,)
        The model layer index (:attr:`SourceInfo.layers`) of the recorded layer each MoE layer takes.
    """
    layers = np.asarray(info(name).layers)
    if isinstance(num_layers, bool) or int(num_layers) != num_layers or num_layers < 1:
        raise ValueError(f"num_layers must be a whole number >= 1, got {num_layers!r}")
    return layers[np.arange(int(num_layers)) % len(layers)]


def popularity(name: str, num_layers: int | None = None) -> np.ndarray:
    """Per-layer expert popularity of source ``name``: the chance one token picks each expert.

    ``p_e = K count_e / sum_e count_e`` in each recorded layer: every row sums to ``K`` and each value
    lies in [0, 1], as :func:`moesd.theory.experts.expected_active_experts_from_popularity` asks.

    Parameters
    ----------
    name : str
        A source (:func:`names`).
    num_layers : int, optional
        Map onto this many MoE layers (:func:`layer_map`); default the recorded layers themselves.

    Returns
    -------
    numpy.ndarray, shape (layers, E)
    """
    source = info(name)
    counts = expert_counts(name).pivot(index="layer", columns="expert", values="count").to_numpy(dtype=float)
    p = source.top_k * counts / counts.sum(axis=1, keepdims=True)
    if num_layers is None:
        return p
    index = {layer: row for row, layer in enumerate(source.layers)}
    return p[[index[layer] for layer in layer_map(name, num_layers)]]


def token_traces(folder="specmoe-switch") -> dict:
    """The per-token sequences of a source folder, one :class:`RoutingTrace` per recorded layer.

    Each sequence was routed at one layer only, so each layer's trace holds that layer's sequences (one
    forward each: phase ``"prefill"``, the encoder's pass over its input text); ``meta`` names the upstream
    sample, dataset and commit of every sequence.

    Parameters
    ----------
    folder : str or os.PathLike
        A folder name in ``data/traces/`` or a path.

    Returns
    -------
    dict of int to RoutingTrace
        By the model's layer index.
    """
    path = Path(folder)
    if not path.is_dir():
        path = next((found for found in _folders() if found.name == str(folder)), path)
    source, frames = read_source(path)
    if "token_routing.csv" not in frames:
        raise ValueError(f"{path} ships no per-token routing (token_routing.csv)")
    (model, spec), = source["models"].items()
    traces = {}
    for layer, rows in frames["token_routing.csv"].groupby("layer"):
        samples = rows.drop_duplicates("sequence")
        traces[int(layer)] = RoutingTrace(
            rows["expert"].to_numpy(np.int64).reshape(-1, 1, 1), spec["experts"], sequence=rows["sequence"].to_numpy(),
            position=rows["position"].to_numpy(), call=rows["sequence"].to_numpy(),
            phase=np.full(len(rows), "prefill"), layers=np.array([int(layer)]),
            meta={"model_id": spec["checkpoint"], "source": source["repository"], "licence": source["licence"],
                  "samples": samples[["sequence", "sample_id", "dataset", "commit"]].to_dict("records")})
    return traces
