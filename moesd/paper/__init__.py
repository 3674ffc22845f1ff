"""Each of the paper's claims judged against this project's measurements, and the predictor checked against the
paper's printed numbers (those are read by :mod:`moesd.paper_tables`)."""
