"""Collectives of a forward pass on several GPUs (beyond the paper): tensor parallelism's all-reduces and gathers,
and expert parallelism's all-to-alls under DP-attention, priced by the hardware record's links.

Pure numpy; no torch.
"""

from __future__ import annotations

import numpy as np

from moesd.architecture import Architecture
from moesd.theory.roofline import Hardware

__all__ = ["link_bandwidth", "collectives", "all_to_alls"]


def link_bandwidth(hardware: Hardware, tp: int) -> float:
    """One direction's bandwidth of a GPU in a tensor-parallel group of ``tp`` (bytes/s): half the data
    sheet's two-way figure, of which a full mesh (``interconnect_peers``) gives the group ``tp - 1`` links."""
    bandwidth = hardware.interconnect_bandwidth / 2
    if hardware.interconnect_peers:
        bandwidth *= min(tp - 1, hardware.interconnect_peers) / hardware.interconnect_peers
    return bandwidth


def collectives(arch: Architecture, hardware: Hardware, tokens, tp: int, a_bytes: int, latency: float):
    """Seconds and bytes per GPU of tensor parallelism's collectives: an all-reduce of the hidden states after the
    (vocabulary-split) embedding and two per layer, and a gather of the logits; none on one GPU.

    Within one node (``tp <= g``, ``g = Hardware.gpus_per_node``) a ring all-reduce of ``M = tokens d a_bytes``
    bytes takes ``latency + 2 (tp - 1) / tp M / b`` and the gather of the logits
    ``latency + (tp - 1) / tp tokens V a_bytes / b``, ``b`` one direction of a GPU's link (:func:`link_bandwidth`).
    Over ``n = tp / g`` nodes the all-reduce is hierarchical: the node's reduce-scatter and all-gather (the
    in-node all-reduce of ``g`` GPUs), and between them an all-reduce (ring) of each GPU's shard ``M / g`` with
    its peers on the other nodes through its own network adapter (``b_net = Hardware.internode_bandwidth`` one
    way, ``L_net = Hardware.internode_latency``)::

        latency + 2 (g - 1) / g M / b + L_net + 2 (n - 1) / n M / (g b_net)

    and the gather of the logits gathers each GPU's share ``S = tokens V a_bytes / tp`` from its peers on the
    other nodes, then the node's ``n S`` per GPU over the node's link:
    ``L_net + (n - 1) S / b_net + latency + (g - 1) / g tokens V a_bytes / b``.
    """
    if tp == 1:
        zero = np.zeros_like(tokens)
        return zero, zero
    per_node = min(tp, hardware.gpus_per_node)
    nodes = tp // per_node
    one_way = link_bandwidth(hardware, per_node)
    ring = 2 * (per_node - 1) / per_node
    all_reduces = 2 * arch.num_layers + 1
    all_reduce = latency + ring * tokens * arch.hidden_size * a_bytes / one_way
    gather = latency + (per_node - 1) / per_node * tokens * arch.vocab_size * a_bytes / one_way
    traffic = all_reduces * ring * tokens * arch.hidden_size * a_bytes
    if nodes > 1:
        shard = 2 * (nodes - 1) / nodes * tokens * arch.hidden_size * a_bytes / per_node
        all_reduce = all_reduce + hardware.internode_latency + shard / hardware.internode_bandwidth
        gather = gather + hardware.internode_latency + (nodes - 1) / tp * tokens * arch.vocab_size * a_bytes \
            / hardware.internode_bandwidth
        traffic = traffic + all_reduces * shard
    return all_reduces * all_reduce + gather, traffic


def all_to_alls(arch: Architecture, hardware: Hardware, local_tokens, K, tp: int, a_bytes: int, latency: float):
    """Seconds and bytes per GPU of expert parallelism's all-to-alls under DP-attention: in every MoE layer a
    dispatch of each of a GPU's ``local_tokens`` hidden states to the GPUs of its ``K`` experts, and a combine
    that brings them back; none on one GPU.

    A GPU sends ``C = local_tokens K d a_bytes`` bytes (one copy per token and expert, as DeepEP's low-latency
    kernels send them), of which uniform routing keeps ``C / tp`` on the GPU itself. Within one node (``tp <= g``)
    one all-to-all takes ``latency + (tp - 1) / tp C / b`` (``b``: one direction of the node's link,
    :func:`link_bandwidth`); across ``tp / g`` nodes the share ``(g - 1) / tp`` goes over the node's link and
    ``(tp - g) / tp`` through the GPU's network adapter at the same time:
    ``L_net + max((g - 1) / tp C / b, (tp - g) / tp C / b_net)``. Both directions carry activations
    (``a_bytes``; DeepEP's fp8 dispatch, which halves the first, is not modelled). The latencies are the
    records' all-reduce latencies (assumed; DeepEP's README and its PR #173 time one dispatch of 128 tokens
    of 7168 values to top-8 experts at 37 us on eight NVLink H20s and 118 us on 16 H800s over 400 Gb/s
    RDMA, mostly bandwidth).
    """
    if tp == 1:
        zero = np.zeros_like(local_tokens)
        return zero, zero
    per_node = min(tp, hardware.gpus_per_node)
    copies = local_tokens * K * arch.hidden_size * a_bytes
    in_node, across = (per_node - 1) / tp * copies, (tp - per_node) / tp * copies
    one_way = link_bandwidth(hardware, per_node)
    seconds = (latency + in_node / one_way if tp == per_node else hardware.internode_latency
               + np.maximum(in_node / one_way, across / hardware.internode_bandwidth))
    return 2 * arch.moe_layers * seconds, 2 * arch.moe_layers * (in_node + across)
