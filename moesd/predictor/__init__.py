"""The predictor (beyond the paper): SD's speedup for any MoE deployment from its shapes and its GPUs' rooflines.

A deployment is one :class:`~moesd.predictor.setup.Setup`; :mod:`~moesd.predictor.models` resolves its models
and builds draft heads, :mod:`~moesd.predictor.layout` lays them on their GPUs, :mod:`~moesd.predictor.kernels`
prices single kernels, :mod:`~moesd.predictor.forward` a whole forward pass, :mod:`~moesd.predictor.engine` a
serving engine's fixed costs; :mod:`~moesd.predictor.predict` gives the speedup of Eq. 4 over a grid,
:mod:`~moesd.predictor.memory` what fits, and :mod:`~moesd.predictor.recommend` whether SD should be on. Pure
numpy: it imports nothing of :mod:`moesd.measure`, :mod:`moesd.model` (Algorithm 1 and the fits to measurements)
or :mod:`moesd.paper`.
"""
