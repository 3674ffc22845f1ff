"""Models of the SD speedup and of step time: Algorithm 1 and its fit, the predictor for any MoE on any GPU, its calibration."""
