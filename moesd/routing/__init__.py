"""Which experts tokens go to: routing traces, their capture (HF, vLLM) and import, and the experts a step loads under each routing."""
