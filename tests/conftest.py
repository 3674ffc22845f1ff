"""Test configuration: hypothesis runs derandomised so that CI is reproducible."""

from hypothesis import settings

settings.register_profile("moesd", derandomize=True, max_examples=200, deadline=None)
settings.load_profile("moesd")
