"""Reading shipped measurements, and the quantities the chapters derive from them."""

import numpy as np
import pandas as pd
import pytest

from moesd.fit import sigma_adjusted_speedup
from moesd.measurements import available, forward_target_efficiency, load, provenance


def test_shipped_studies_load_with_provenance():
    assert ("cpu", "e2e") in available() and ("cpu", "forward") in available("forward")
    frame, sidecar = load("e2e", "cpu")
    assert {"batch_size", "gamma", "speedup", "run"} <= set(frame.columns) and sidecar["complete"]
    line = provenance(sidecar)
    assert "random weights" in line and "synthetic acceptance" in line
    with pytest.raises(FileNotFoundError, match="moesd sweep e2e"):
        load("e2e", "tpu")


def test_forward_target_efficiency():
    forward = pd.DataFrame([{"role": "target", "batch_size": b, "tokens": s, "run": r,
                             "seconds": (1 + 0.1 * s * b) * (1 + 0.01 * r)}
                            for b in (1, 4) for s in (1, 3) for r in range(3)])
    table = forward_target_efficiency(forward, gammas=(2,))
    assert table["efficiency"].tolist() == pytest.approx([1.1 / 1.3, 1.4 / 2.2])
    assert (table["low"] <= table["efficiency"]).all() and (table["efficiency"] <= table["high"]).all()
    with pytest.raises(ValueError, match="4 tokens"):
        forward_target_efficiency(forward, gammas=(3,))


def test_sigma_adjustment():
    frame = pd.DataFrame({"K": [8, 8, 2, 2], "gamma": [2, 2, 2, 2], "sigma": [0.9, 0.9, 0.6, 0.6],
                          "speedup": [2.0, 1.0, 1.2, 0.6]})
    assert sigma_adjusted_speedup(frame).tolist() == pytest.approx([2.0, 1.0, 1.8, 0.9])
    with pytest.raises(ValueError, match="K = 4"):
        sigma_adjusted_speedup(frame, reference_k=4)
    assert np.isfinite(sigma_adjusted_speedup(frame)).all()


def test_ridge_point_comes_from_the_sidecars_measured_roofline():
    from moesd.measurements import ridge_point_for
    from moesd.roofline import HARDWARE

    record = HARDWARE["H200"].as_dict()
    assert ridge_point_for({"hardware": record}) == pytest.approx(989.5e12 / 4.8e12)
    with pytest.raises(ValueError, match="no measured roofline"):
        ridge_point_for({"device": "AMD EPYC"})
    with pytest.raises(ValueError, match="unknown Hardware field"):
        ridge_point_for({"hardware": {**record, "colour": "green"}})
