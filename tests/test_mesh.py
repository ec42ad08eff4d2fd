"""scalebook.mesh: the set-up every notebook runs first. Each case runs in a fresh process,
because JAX fixes its device count when it first starts."""

import subprocess
import sys
import textwrap

import pytest

import scalebook
from scalebook.errors import DeviceCountError


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120)


def test_fresh_process_gets_eight_simulated_devices_and_says_so():
    r = run("""
        import scalebook
        info = scalebook.setup()
        import jax
        assert len(jax.devices()) == 8 and info.n_devices == 8 and info.simulated
        again = scalebook.setup()          # running the set-up cell twice is fine
        assert again == info
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("with 8 simulated CPU devices") == 2


def test_jax_started_too_early_is_a_clear_error_not_a_one_device_run():
    r = run("""
        import jax, jax.numpy as jnp
        jnp.ones(3).block_until_ready()     # JAX starts with its default single CPU device
        import scalebook
        scalebook.setup()
    """)
    assert r.returncode != 0
    assert "DeviceCountError" in r.stderr
    assert "needs 8 devices, but JAX already started with 1" in r.stderr
    assert "Restart the kernel" in r.stderr


def test_other_device_counts():
    r = run("""
        import scalebook
        info = scalebook.setup(4, quiet=True)
        import jax
        assert len(jax.devices()) == 4
        scalebook.make_mesh((2, 2), ("a", "b"))
    """)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("bad", [0, -8, 2.0, True, "8"])
def test_bad_device_count(bad):
    with pytest.raises(ValueError, match="n_devices must be a positive integer"):
        scalebook.setup(bad)


def test_make_mesh_validates_its_shape():
    mesh = scalebook.make_mesh((2, 4), ("x", "y"))
    assert dict(mesh.shape) == {"x": 2, "y": 4}
    with pytest.raises(ValueError, match="needs 6 devices; the notebook has 8"):
        scalebook.make_mesh((2, 3), ("x", "y"))
    with pytest.raises(ValueError, match="differ in length"):
        scalebook.make_mesh((8,), ("x", "y"))
    with pytest.raises(ValueError, match="positive integers"):
        scalebook.make_mesh((0, 8), ("x", "y"))


def test_require_devices():
    from scalebook.mesh import require_devices
    require_devices(8)
    with pytest.raises(DeviceCountError, match="needs 16 devices"):
        require_devices(16)
