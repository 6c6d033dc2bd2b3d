"""The wheel built from this checkout ships every subpackage and decodes from a plain install."""
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Folder of the source tree -> the name it installs under (pyproject.toml / setup.py).
INSTALLED_AS = {"zerogr_core": "zerogr_core", "kernels": "zerogr_kernels"}


def source_packages():
    """Every folder with an ``__init__.py`` under zerogr_core/ and kernels/, as installed names."""
    found = set()
    for folder, name in INSTALLED_AS.items():
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                found.add(name if rel == "." else ".".join([name, *rel.split(os.sep)]))
    return found


def run(args, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True, timeout=240, **kwargs)
    assert done.returncode == 0, f"{args[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


# Runs with the install target first on the path and the checkout nowhere on it: a tiny random
# T5 over a tiny catalog, decoded through the installed adapter.
DECODE = textwrap.dedent("""
    import os, sys
    target = sys.argv[1]
    sys.path.insert(0, target)
    import numpy as np, torch, transformers
    import zerogr_core, zerogr_core.hf, zerogr_core.models, zerogr_kernels
    for mod in (zerogr_core, zerogr_core.hf, zerogr_core.models, zerogr_kernels):
        assert os.path.realpath(mod.__file__).startswith(os.path.realpath(target)), mod.__file__
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=20, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                   num_decoder_layers=1, num_heads=4, decoder_start_token_id=0,
                                   pad_token_id=0, eos_token_id=1, dropout_rate=0.0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    rng = np.random.default_rng(0)
    sids = np.unique(np.stack([rng.integers(0, s, 30) for s in (4, 5, 6)], axis=1), axis=0)
    catalog = zerogr_core.Catalog.from_sids(sids, (4, 5, 6))
    index = zerogr_core.build_index(catalog)
    result = zerogr_core.hf.generate(model, torch.tensor([[5, 9, 13, 4]]), index, beam_width=4,
                                     token_offsets=(3, 7, 12))
    rows = result.item_rows[0]
    assert tuple(result.tokens.shape) == (1, 4, 3), result.tokens.shape
    assert bool((rows >= 0).all()), rows
    assert np.array_equal(catalog.sids[rows.numpy()], result.tokens[0].numpy())
    print("decoded", rows.tolist())
""")


def test_wheel_ships_every_subpackage_and_decodes_when_installed(tmp_path):
    # setuptools builds in the source folder (build/, *.egg-info): build from a copy of what a
    # clone holds, which also keeps stray files of this checkout out of the wheel.
    source, wheels, target = tmp_path / "source", tmp_path / "wheels", tmp_path / "site"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(os.path.join(ROOT, name), source / name)
    for folder in INSTALLED_AS:
        shutil.copytree(os.path.join(ROOT, folder), source / folder, ignore=skip)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
         str(source)], cwd=tmp_path)
    (wheel,) = wheels.glob("zerogr-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {os.path.dirname(n).replace("/", ".") for n in archive.namelist() if n.endswith("/__init__.py")}
    assert source_packages() - shipped == set(), "subpackages missing from the wheel"

    run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        cwd=tmp_path)
    # -I: neither PYTHONPATH (which the conftest points at this checkout) nor the working
    # folder reaches the path; the interpreter's own site-packages bring torch and transformers.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = run([sys.executable, "-I", "-c", DECODE, str(target)], cwd=tmp_path, env=env)
    assert "decoded" in done.stdout
