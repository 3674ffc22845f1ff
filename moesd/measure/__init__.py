"""Measuring SD: the studies through either engine (moesd's own, vLLM's) and their files, the measuring machine's
roofline and regime, and what a study's sidecar records of the device and the models."""
