"""Measuring SD: the engines (HF, vLLM), the studies and their files, the measuring machine's roofline and regime."""
