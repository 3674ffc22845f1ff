"""Algorithm 1 and its fit to measurements (the paper's App. C), and the predictor (:mod:`moesd.predictor`) calibrated
on a measured forward study."""
