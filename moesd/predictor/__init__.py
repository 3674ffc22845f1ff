"""The predictor (beyond the paper): SD's speedup for any MoE deployment from its shapes and its GPUs' rooflines.

A deployment is one :class:`~moesd.predictor.setup.Setup`; :mod:`~moesd.predictor.models` resolves its models
(zoo names, records, any ``config.json``) and builds the drafters of a target (MTP, EAGLE, EAGLE-3, Medusa, n-gram),
:mod:`~moesd.predictor.layout` lays them on their GPUs,
:mod:`~moesd.predictor.kernels` prices single kernels, :mod:`~moesd.predictor.forward` a whole forward pass (with
:mod:`~moesd.predictor.experts` and :mod:`~moesd.predictor.collectives`), :mod:`~moesd.predictor.engine` a serving
engine's fixed costs; :mod:`~moesd.predictor.predict` gives the speedup of Eq. 4 over a grid,
:mod:`~moesd.predictor.memory` what fits, :mod:`~moesd.predictor.band` the error band around a prediction, and
:mod:`~moesd.predictor.recommend` whether SD should be on. Pure
numpy: it imports nothing of :mod:`moesd.measure`, :mod:`moesd.model` (Algorithm 1 and the fits to measurements)
or :mod:`moesd.paper`.
"""
