"""What result records say about the code that produced them: the source digest."""
import shutil

import torch

from zerogr_core.environment import ROOT, SOURCE_FOLDERS, environment, source_digest


def _tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_digest_names_the_sources_not_the_checkout(tmp_path):
    files = {"zerogr_core/a.py": "x = 1\n", "zerogr_core/sub/b.py": "y = 2\n", "kernels/k.py": "z = 3\n",
             "zerogr_core/notes.txt": "not code\n", "runs/probe.py": "outside the folders\n"}
    one = source_digest.__wrapped__(_tree(tmp_path / "one", files))
    assert len(one) == 12 and int(one, 16) >= 0
    # a copy elsewhere, with files outside the source folders changed, has the same digest
    two = _tree(tmp_path / "two", dict(files, **{"zerogr_core/notes.txt": "edited\n", "runs/probe.py": "edited\n"}))
    assert source_digest.__wrapped__(two) == one
    # one byte of one source, a renamed source, or a new one changes it
    assert source_digest.__wrapped__(_tree(tmp_path / "byte", dict(files, **{"kernels/k.py": "z = 4\n"}))) != one
    renamed = {("zerogr_core/c.py" if k == "zerogr_core/a.py" else k): v for k, v in files.items()}
    assert source_digest.__wrapped__(_tree(tmp_path / "renamed", renamed)) != one
    shutil.copytree(tmp_path / "one", tmp_path / "added")
    _tree(tmp_path / "added", {"kernels/new.py": ""})
    assert source_digest.__wrapped__(tmp_path / "added") != one
    assert source_digest.__wrapped__(tmp_path / "empty") == "n/a"


def test_every_record_carries_the_digest_of_the_imported_packages():
    # the packages this process imports (kernels/ as zerogr_kernels) read as the checkout's folders
    env = environment(torch.device("cpu"))
    assert env["source_digest"] == source_digest() == source_digest.__wrapped__(ROOT)
    assert SOURCE_FOLDERS == ("zerogr_core", "kernels")
