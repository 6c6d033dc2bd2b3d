"""The app's server files: data roots, path resolution, bounded loads and redacted errors.

The page-level behaviour is driven in tests/test_app_catalog.py (AppTest) and in the browser
(tests/e2e); this module checks the mechanisms themselves.
"""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_core.app_support.sources import (CatalogSource, app_settings, load_source, resolve_server_path,
                                             server_file_source, stage_upload)
from zerogr_core.catalog import io as catalog_io
from zerogr_core.catalog.io import load_catalog
from zerogr_core.catalog.limits import LIMIT_PRESETS, MB, LoadLimits, limits_from
from zerogr_core.catalog.samples import SAMPLE_DIR
from zerogr_core.errors import WITHHELD, CatalogError, ZeroGRError

SECRET = "S3CRET-root:x:0:0"


@pytest.fixture
def tree(tmp_path):
    """root/ (a data root) with a catalog, a sub-folder and links; outside/ with a secret file."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "good.csv").write_text("item_id,s1,s2\n1,0,0\n2,0,1\n")
    (root / "sub" / "deep.csv").write_text("item_id,s1\n1,0\n")
    (outside / "secret.csv").write_text(f"item_id,s1\n{SECRET},1\n")
    (root / "escape.csv").symlink_to(outside / "secret.csv")
    (root / "outdir").symlink_to(outside, target_is_directory=True)
    (root / "inner.csv").symlink_to(root / "sub" / "deep.csv")
    (root / "folder.csv").mkdir()
    os.mkfifo(root / "pipe.csv")
    return root.resolve(), outside.resolve()


# ---------------------------------------------------------------------------- path resolution
def test_paths_inside_a_root_resolve_to_their_real_file(tree):
    root, _ = tree
    assert resolve_server_path(str(root / "good.csv"), [root]) == root / "good.csv"
    assert resolve_server_path(" 'good.csv' ", [root]) == root / "good.csv"  # relative to the root
    assert resolve_server_path("sub/../good.csv", [root]) == root / "good.csv"
    assert resolve_server_path("inner.csv", [root]) == root / "sub" / "deep.csv"  # a link that stays inside


@pytest.mark.parametrize("typed", ["{outside}/secret.csv", "../outside/secret.csv", "{root}/../outside/secret.csv",
                                   "escape.csv", "outdir/secret.csv", "nope.csv", "{root}/nope.csv", "folder.csv",
                                   "pipe.csv", "sub/../../outside/secret.csv", "/etc/../etc/passwd.csv",
                                   "~nosuchuser__/x.csv", "a\x00b.csv"])
def test_refused_and_missing_paths_get_one_message(tree, typed):
    root, outside = tree
    text = typed.format(root=root, outside=outside)
    with pytest.raises(CatalogError) as info:
        resolve_server_path(text, [root])
    message = str(info.value)
    with pytest.raises(CatalogError) as missing:
        resolve_server_path(str(root / "definitely-missing.csv"), [root])
    assert message == str(missing.value)
    assert str(root) in message and "ZEROGR_DATA_DIR" in message
    assert "secret" not in message and "nope" not in message and "\n" not in message


def test_home_is_expanded_before_the_check(tree, monkeypatch):
    root, outside = tree
    monkeypatch.setenv("HOME", str(outside))
    with pytest.raises(CatalogError, match="no catalog file at that path"):
        resolve_server_path("~/secret.csv", [root])
    monkeypatch.setenv("HOME", str(root))
    assert resolve_server_path("~/good.csv", [root]) == root / "good.csv"


def test_extension_is_checked_on_the_typed_name_first(tree):
    root, _ = tree
    with pytest.raises(CatalogError, match="unsupported file type '.conf'"):
        resolve_server_path("/etc/nothing-here.conf", [root])


def test_a_path_of_no_supported_extension_is_told_what_the_path_needs(tree):
    """A server path with no extension was told to 'upload one of .csv, …', as if it were an upload."""
    root, _ = tree
    for typed, shown in (("my_catalog", "(none)"), ("notes.conf", ".conf")):
        with pytest.raises(CatalogError) as err:
            resolve_server_path(typed, [root])
        assert str(err.value) == (f"{typed}: unsupported file type {shown!r}; the path needs one of the extensions "
                                  ".csv, .tsv, .txt, .parquet")
    with pytest.raises(CatalogError, match=r"'\(none\)'; upload one of \.csv"):  # an upload is still told to upload
        stage_upload("catalog", b"item_id,s1\n1,0\n", max_bytes=100, folder=root)


def test_a_second_root_is_searched_and_relative_paths_try_each_root(tree, tmp_path):
    root, outside = tree
    assert resolve_server_path("secret.csv", [root, outside]) == outside / "secret.csv"
    assert resolve_server_path("escape.csv", [root, outside]) == outside / "secret.csv"  # now inside a root


SEGMENTS = ["..", ".", "sub", "outdir", "root", "outside", "good.csv", "escape.csv", "inner.csv", "secret.csv",
            "deep.csv", "folder.csv"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=6), absolute=st.booleans())
def test_resolution_never_leaves_the_root(tree, parts, absolute):
    root, outside = tree
    text = os.path.join(str(root.parent) if absolute else "", *parts)
    if not text.endswith(".csv"):
        text += "/good.csv"
    try:
        real = resolve_server_path(text, [root])
    except CatalogError as err:
        assert str(err).startswith("no catalog file at that path") or "unsupported" in str(err)
        return
    assert real.is_relative_to(root) and real.is_file() and real == real.resolve()
    assert real == Path(os.path.realpath(text if absolute else root / text))


# ---------------------------------------------------------------------------- settings
def test_settings_from_the_environment_and_the_config_file(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    config = tmp_path / "zerogr.toml"
    config.write_text(f'[data]\ndirs = ["{b}", "sample_catalogs", "/no/such/folder"]\n'
                      '[limits]\npreset = "shared"\nmax_rows = 1234\n')
    got = app_settings({"ZEROGR_DATA_DIR": f"{a}{os.pathsep}{a}{os.pathsep}"}, config)
    assert got.roots == (SAMPLE_DIR.resolve(), b.resolve(), a.resolve())  # samples first, no duplicates
    assert got.missing_roots == ("/no/such/folder",)
    assert got.limits == LoadLimits(1234, LIMIT_PRESETS["shared"].max_file_bytes,
                                    LIMIT_PRESETS["shared"].max_decoded_bytes)
    plain = app_settings({}, tmp_path / "absent.toml")
    assert plain.roots == (SAMPLE_DIR.resolve(),) and not plain.extra_roots and plain.limits == LoadLimits()


@pytest.mark.parametrize("text,fragment", [
    ("[data]\ndirs = '/one/string'\n", "list of folder paths"),
    ("[limits]\nmax_rowz = 5\n", "max_rowz"),
    ("[limits]\nmax_rows = 'many'\n", "max_rows"),
    ("[limits]\npreset = 'huge'\n", "unknown preset 'huge'"),
    ("[data\n", "cannot read the settings"),
])
def test_bad_settings_are_one_line_errors(tmp_path, text, fragment):
    config = tmp_path / "zerogr.toml"
    config.write_text(text)
    with pytest.raises(ZeroGRError) as info:
        app_settings({}, config)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_limits_from_the_environment():
    env = {"ZEROGR_LIMITS": "large", "ZEROGR_MAX_ROWS": "1e6", "ZEROGR_MAX_DECODED_MB": "0.5"}
    got = limits_from("shared", None, env)
    assert got == LoadLimits(1_000_000, LIMIT_PRESETS["large"].max_file_bytes, MB // 2)
    with pytest.raises(ZeroGRError, match="ZEROGR_MAX_ROWS='lots'"):
        limits_from(None, None, {"ZEROGR_MAX_ROWS": "lots"})
    with pytest.raises(ZeroGRError, match="max_rows must be a positive"):
        limits_from(None, None, {"ZEROGR_MAX_ROWS": "0"})
    assert "up to 20,000,000 rows" in LoadLimits().describe()


# ---------------------------------------------------------------------------- bounded loads
def _rows_csv(path: Path, n: int) -> Path:
    path.write_text("item_id,s1,s2\n" + "".join(f"{i},{i % 7},{i // 7}\n" for i in range(n)))
    return path


def _rows_parquet(path: Path, n: int) -> Path:
    pl.DataFrame({"item_id": range(n), "s1": [i % 7 for i in range(n)], "s2": [i // 7 for i in range(n)]}
                 ).write_parquet(path)
    return path


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 60), limit=st.integers(1, 60), parquet=st.booleans())
def test_row_limit(tmp_path, n, limit, parquet):
    path = (_rows_parquet if parquet else _rows_csv)(tmp_path / f"rows{n}.{'parquet' if parquet else 'csv'}", n)
    limits = LoadLimits(max_rows=limit)
    if n <= limit:
        assert load_catalog(path, limits=limits).n_items == n
    else:
        with pytest.raises(CatalogError, match=f"{n:,} rows, over the limit of {limit:,} rows"):
            load_catalog(path, limits=limits)


@pytest.mark.parametrize("parquet", [False, True])
def test_over_the_row_limit_is_refused_before_the_file_is_read(tmp_path, monkeypatch, parquet):
    path = (_rows_parquet if parquet else _rows_csv)(tmp_path / f"many.{'parquet' if parquet else 'csv'}", 5000)

    def never(*args, **kwargs):
        raise AssertionError("the file was materialised")

    monkeypatch.setattr(catalog_io, "_read_frame", never)
    with pytest.raises(CatalogError, match="5,000 rows, over the limit of 4,999 rows"):
        load_catalog(path, limits=LoadLimits(max_rows=4999))


def plain_bomb(path: Path, decoded_mb: int = 64) -> Path:
    """A zstd Parquet file of a few KB whose title column decodes to ``decoded_mb`` MB."""
    rows = 16
    table = pa.table({"item_id": list(range(rows)), "s1": [i % 4 for i in range(rows)],
                      "title": ["a" * (decoded_mb * MB // rows)] * rows})
    pq.write_table(table, path, compression="zstd", use_dictionary=False)
    return path


def dictionary_bomb(path: Path, rows: int = 200_000, value_bytes: int = 1000) -> Path:
    """Dictionary encoding: one long title stored once, repeated on every row."""
    table = pa.table({"item_id": pa.array(range(rows), pa.int64()), "s1": pa.array([i % 250 for i in range(rows)]),
                      "s2": pa.array([i // 250 for i in range(rows)]), "title": ["t" * value_bytes] * rows})
    pq.write_table(table, path, compression="zstd", use_dictionary=True)
    return path


def test_a_parquet_bomb_is_refused_from_its_metadata(tmp_path, monkeypatch):
    path = plain_bomb(tmp_path / "bomb.parquet")
    assert path.stat().st_size < MB // 4
    monkeypatch.setattr(catalog_io, "_read_frame", lambda *a, **k: pytest.fail("the bomb was decoded"))
    with pytest.raises(CatalogError, match="decodes to 64 MB, over the limit of 16 MB decoded"):
        load_catalog(path, limits=LoadLimits(max_decoded_bytes=16 * MB))


def test_a_dictionary_bomb_is_refused_before_its_text_is_copied(tmp_path):
    path = dictionary_bomb(tmp_path / "dict.parquet")
    assert path.stat().st_size < 4 * MB
    with pytest.raises(CatalogError, match=r"decodes to \d+ MB, over the limit of 64 MB decoded"):
        load_catalog(path, limits=LoadLimits(max_decoded_bytes=64 * MB))
    assert load_catalog(path, limits=LoadLimits(max_decoded_bytes=512 * MB)).n_items == 200_000


def test_file_size_limit_and_csv_decoded_size(tmp_path):
    path = _rows_csv(tmp_path / "mid.csv", 2000)
    size = path.stat().st_size
    with pytest.raises(CatalogError, match="MB on disk"):
        load_catalog(path, limits=LoadLimits(max_file_bytes=size - 1))
    with pytest.raises(CatalogError, match="MB decoded"):
        load_catalog(path, limits=LoadLimits(max_decoded_bytes=size - 1))
    assert load_catalog(path, limits=LoadLimits(max_file_bytes=size, max_decoded_bytes=size)).n_items == 2000
    assert load_catalog(path).n_items == 2000  # the CLI passes no limits


def test_uploads_and_server_files_use_the_app_limits(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROGR_MAX_ROWS", "10")
    data = _rows_csv(tmp_path / "up.csv", 11).read_bytes()
    with pytest.raises(CatalogError, match="^big.csv: 11 rows, over the limit of 10 rows$"):
        load_source(stage_upload("big.csv", data, max_bytes=10 * MB, folder=tmp_path / "staged"))
    src = server_file_source("up.csv", [tmp_path.resolve()])
    with pytest.raises(CatalogError, match="^up.csv: 11 rows, over the limit of 10 rows$"):
        load_source(src)


# ---------------------------------------------------------------------------- redaction
S = SECRET
REDACTED_CASES = {
    # file text, codebook sizes, fragments that must remain
    "duplicate-string-id": (f"item_id,s1\n{S},1\n8,2\n{S},3\n", None, ["row 3", "column 'item_id'", "also on row 1"]),
    "non-integer-token": (f"item_id,s1,s2\n1,3,4\n2,{S},4\n", None, ["row 2", "column 's1'", "not an integer"]),
    "sid-token": (f"item_id,sid\n1,3 4\n2,3 {S}\n", None, ["row 2", "column 'sid'", "token 2"]),
    "fractional": ("item_id,s1\n1,3\n2,31337.5\n", None, ["row 2", "column 's1'", "not an integer"]),
    "negative": ("item_id,s1,s2\n1,3,4\n2,1,-31337\n", None, ["row 2", "column 's2'", "negative token"]),
    "over-codebook": ("item_id,s1,s2\n1,3,4\n2,1,31337\n", (4, 8), ["row 2", "column 's2'", "≥ codebook size 8"]),
    "duplicate-id": ("item_id,s1\n31337,1\n8,2\n31337,3\n", None, ["row 3", "column 'item_id'", "also on row 1"]),
    "duplicate-sid": ("item_id,s1,s2\n31337,31337,4\n2,0,1\n31338,31337,4\n", None, ["column 's1–s2'", "shared"]),
    "header-is-content": (f"{S}\n{S}\n", None, ["no 'item_id' column"]),
    "duplicate-column": (f"item_id,s1,{S},{S.upper()}\n1,2,3,4\n", None, ["appears twice"]),
}


@pytest.mark.parametrize("case", sorted(REDACTED_CASES))
def test_redacted_errors_name_row_and_column_but_never_a_value(tmp_path, case):
    text, sizes, fragments = REDACTED_CASES[case]
    path = tmp_path / f"{case}.csv"
    path.write_text(text)
    with pytest.raises(CatalogError) as plain:
        load_catalog(path, codebook_sizes=sizes)
    with pytest.raises(CatalogError) as info:
        load_catalog(path, codebook_sizes=sizes, redact_values=True)
    message = str(info.value)
    assert "S3CRET" in str(plain.value).upper() or "31337" in str(plain.value)  # the plain message quotes it
    assert "S3CRET" not in message.upper() and "31337" not in message and "root:x" not in message
    assert WITHHELD in message or case == "header-is-content" and "(value withheld)" in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_redacted_parquet_metadata_and_read_errors(tmp_path):
    path = tmp_path / "meta.parquet"
    pl.DataFrame({"item_id": [1], "s1": [0]}).write_parquet(path, metadata={"zerogr.codebook_sizes": SECRET})
    with pytest.raises(CatalogError) as info:
        load_catalog(path, redact_values=True)
    assert SECRET not in str(info.value) and "zerogr.codebook_sizes" in str(info.value)
    fake = tmp_path / "fake.parquet"
    fake.write_text(SECRET * 10)
    for limits in (None, LoadLimits()):
        with pytest.raises(CatalogError) as info:
            load_catalog(fake, redact_values=True, limits=limits)
        assert SECRET not in str(info.value) and "cannot read as PARQUET" in str(info.value)


def test_server_files_are_redacted_and_uploads_are_not(tmp_path, monkeypatch):
    data = f"item_id,s1\n1,1\n2,{SECRET}\n".encode()
    (tmp_path / "leak.csv").write_bytes(data)
    server = load_error(server_file_source("leak.csv", [tmp_path.resolve()]))
    assert server == f"leak.csv, row 2, column 's1': {WITHHELD} is not an integer"
    upload = load_error(stage_upload("leak.csv", data, max_bytes=MB, folder=tmp_path / "staged"))
    assert upload == f"leak.csv, row 2, column 's1': '{SECRET}' is not an integer"

    def crash(*args, **kwargs):
        raise RuntimeError(f"reader failed near {SECRET}")

    monkeypatch.setattr(catalog_io, "_read_frame", crash)
    assert load_error(server_file_source("leak.csv", [tmp_path.resolve()])) == \
        "leak.csv: cannot read this file (RuntimeError)"


def load_error(source: CatalogSource) -> str:
    with pytest.raises(CatalogError) as info:
        load_source(source)
    return str(info.value)
