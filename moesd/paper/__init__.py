"""The paper's printed numbers, and each of its claims judged against this project's measurements."""
