"""The package's surface: no torch on import, submodules reachable by their names."""

import importlib
import subprocess
import sys



def test_import_does_not_load_torch():
    code = "import sys, moesd; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_sweep_settings_and_refused_commands_do_not_load_torch():
    """Sweep settings are checked, and a bad `moesd sweep` or `moesd fit` refused, without importing torch."""
    code = ("import sys; from moesd.measure.presets import preset; from moesd.cli import main\n"
            "for study in ('forward', 'e2e', 'sparsity', 'dense', 'dense_forward', 'settings'): preset(study)\n"
            "for argv in (['sweep', 'e2e', '--rounds', '0'], ['fit', 'missing.csv']):\n"
            "    try: main(argv)\n"
            "    except SystemExit as exit_: assert exit_.code == 2\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_submodules_are_not_shadowed_by_exports():
    """moesd.speedup is not a name moesd exports: the theory's modules keep their dotted names."""
    import moesd.theory

    for name in ("experts", "speedup", "roofline"):
        assert importlib.import_module(f"moesd.theory.{name}").__name__ == f"moesd.theory.{name}"
        assert getattr(moesd.theory, name).__name__ == f"moesd.theory.{name}"


def test_hub_libraries_are_offline_without_the_makefile():
    """tests/conftest.py set the offline switches before huggingface_hub and datasets read them."""
    import datasets.config
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE and constants.is_offline_mode()
    assert datasets.config.HF_HUB_OFFLINE


def test_no_backend_forced_on_the_notebooks():
    """MPLBACKEND is removed, so the kernels nbval starts keep IPython's inline figures."""
    import os

    assert "MPLBACKEND" not in os.environ
