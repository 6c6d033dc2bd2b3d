"""End-to-end: the real app (`streamlit run app.py`) in headless Chromium through Playwright.

Starts the server on a free port, waits for /_stcore/health, uploads a valid and an invalid
catalog through the real file uploader, runs a decode comparison, checks that every page
renders its charts with no exception element, and saves a screenshot of every page under
test-artifacts/screenshots/. Uses Debian's chromium (/usr/bin/chromium; `make browser`
installs it): Playwright cannot download its own browser here.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = os.environ.get("ZEROGR_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

#: URLs the browser requested (filled by every browser context of this module).
REQUESTS: list[str] = []


def outbound(urls) -> list[str]:
    """The URLs that would leave the machine: anything but the local server and inline data."""
    from urllib.parse import urlsplit

    return [u for u in urls if urlsplit(u).scheme not in ("data", "blob", "about")
            and urlsplit(u).hostname not in ("127.0.0.1", "localhost", "::1")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path_factory, extra_env: dict | None = None):
    """Run `streamlit run app.py` on a free port until the generator is closed; yields its URL."""
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (run `make browser`)")
    pytest.importorskip("playwright.sync_api")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the real app: reference path on CPU
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra_env or {})
    log_path = tmp_path_factory.mktemp("server") / "streamlit.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.address",
         "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as resp:
                if resp.status == 200 and resp.read().strip() == b"ok":
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise AssertionError(f"streamlit did not become healthy:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    text = log_path.read_text()
    assert "unexpected error in a page" not in text, text[-3000:]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from _serve(tmp_path_factory)


@pytest.fixture(scope="module")
def playwright_driver():
    """One Playwright driver for the module (its sync API allows one at a time per thread)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        yield pw


def _browse(pw, url: str):
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser = pw.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                                 args=CHROMIUM_ARGS, headless=True)
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    # every request the page makes, from its first load on: the app must work offline
    context.on("request", lambda request: REQUESTS.append(request.url))
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(url)
    yield pg
    context.close()
    browser.close()


@pytest.fixture(scope="module")
def page(playwright_driver, server):
    yield from _browse(playwright_driver, server)


def wait_idle(pg, settle: float = 0.8, timeout: float = 120) -> None:
    """Wait until the script has finished: stApp's data-test-script-state reads "notRunning"
    (and nothing is marked stale) for ``settle`` seconds."""
    pg.wait_for_selector('[data-testid="stApp"]', state="attached")
    deadline = time.time() + timeout
    quiet_since = None
    while time.time() < deadline:
        busy = pg.evaluate("""() => {
            const app = document.querySelector('[data-testid="stApp"]');
            const state = app ? app.getAttribute('data-test-script-state') : 'initial';
            return state !== 'notRunning' || document.querySelectorAll('[data-stale="true"]').length > 0;
        }""")
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.time()
        elif time.time() - quiet_since >= settle:
            return
        time.sleep(0.2)
    raise AssertionError("the app did not finish running in time")


def no_exception(pg) -> None:
    assert pg.locator('[data-testid="stException"]').count() == 0, pg.locator(
        '[data-testid="stException"]').first.inner_text()


def go(pg, title: str) -> None:
    pg.locator('[data-testid="stSidebar"] a').filter(has_text=title).first.click()
    pg.wait_for_function("t => document.querySelector('h1') && document.querySelector('h1').innerText.includes(t)",
                         arg=title, timeout=60_000)
    wait_idle(pg)


def charts_rendered(pg, at_least: int) -> None:
    pg.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {at_least}",
                         timeout=60_000)


def shot(pg, name: str) -> None:
    """Screenshot the whole page: Streamlit scrolls inside its main pane, so grow the viewport to fit."""
    width = pg.viewport_size["width"]
    height = pg.evaluate("Math.max(...Array.from(document.querySelectorAll("
                         "'[data-testid=\"stMain\"], [data-testid=\"stMainBlockContainer\"]'))"
                         ".map(e => e.scrollHeight), 800)")
    pg.set_viewport_size({"width": width, "height": min(int(height) + 40, 7000)})
    pg.wait_for_timeout(1200)  # plotly re-lays out on resize; data grids draw their canvas
    # visible grids only: one in a closed expander or a hidden tab never draws
    pg.wait_for_function("Array.from(document.querySelectorAll('[data-testid=\"stDataFrame\"]'))"
                         ".every(d => d.offsetParent === null || (d.closest('details') && !d.closest('details').open)"
                         " || d.querySelector('canvas'))", timeout=20_000)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    pg.set_viewport_size({"width": width, "height": 1000})


def test_app_in_browser(page, tmp_path):
    pg = page
    t0 = time.time()
    wait_idle(pg)
    no_exception(pg)
    assert "Catalog" in pg.locator("h1").first.inner_text()
    shot(pg, "1_catalog")

    # -- uploads through the real file uploader: a valid file, then an invalid one
    good = tmp_path / "my_catalog.csv"
    good.write_text("item_id,s1,s2,s3,title\n" + "".join(
        f"{100 + i},{i % 3},{(i // 3) % 4},{i // 12},Item {i}\n" for i in range(40)))
    bad = tmp_path / "broken_catalog.csv"
    bad.write_text("item_id,s1,s2\n1,0,0\n2,0,x\n3,1,0\n")
    pg.get_by_text("Upload a file", exact=True).click()
    wait_idle(pg)
    uploader = pg.locator('[data-testid="stFileUploaderDropzoneInput"]')
    uploader.set_input_files(str(good))
    pg.get_by_text("Loaded upload: my_catalog.csv").wait_for()
    wait_idle(pg)
    no_exception(pg)
    assert "40" in pg.locator('[data-testid="stMetricValue"]').first.inner_text()
    shot(pg, "1b_catalog_upload_ok")
    uploader.set_input_files(str(bad))
    error = pg.locator('[data-testid="stAlertContentError"]').first
    error.wait_for()
    text = error.inner_text()
    assert "broken_catalog.csv" in text and "row 2" in text and "column 's2'" in text, text
    wait_idle(pg)
    no_exception(pg)
    assert "upload: my_catalog.csv" in pg.get_by_text("The catalog in use stays").inner_text()
    shot(pg, "1c_catalog_upload_error")
    # 50 rows × 2,000 levels: once accepted, it kept the server busy for minutes; now one line, at once
    wide = tmp_path / "wide_catalog.csv"
    wide.write_text("item_id," + ",".join(f"s{i}" for i in range(1, 2001)) + "\n" + "".join(
        f"{r}," + ",".join(str((r * 7 + i) % 5) for i in range(2000)) + "\n" for r in range(50)))
    start = time.time()
    uploader.set_input_files(str(wide))
    refusal = pg.locator('[data-testid="stAlertContentError"]').filter(has_text="wide_catalog.csv").first
    refusal.wait_for(timeout=10_000)
    elapsed = time.time() - start
    # the box reads the icon's name ("error"), then the message: one line
    lines = [line for line in refusal.inner_text().splitlines() if line.strip() and line.strip() != "error"]
    assert len(lines) == 1 and "2,000 SID levels, over the limit of 16" in lines[0], lines
    assert elapsed < 2, f"the 2,000-level upload took {elapsed:.2f} s to refuse"
    wait_idle(pg)
    no_exception(pg)
    assert "upload: my_catalog.csv" in pg.get_by_text("The catalog in use stays").inner_text()

    # -- back to the bundled MovieLens catalog (the default sample)
    pg.get_by_text("Bundled sample", exact=True).click()
    wait_idle(pg)
    no_exception(pg)

    go(pg, "Density")
    charts_rendered(pg, 3)
    no_exception(pg)
    shot(pg, "2_density")

    go(pg, "Index")
    charts_rendered(pg, 3)
    no_exception(pg)
    shot(pg, "3_index")

    go(pg, "Decode")
    no_exception(pg)
    pg.get_by_role("button", name="Run both orders").click()
    pg.get_by_text("Lists that agree").first.wait_for(timeout=120_000)
    wait_idle(pg)
    charts_rendered(pg, 2)
    no_exception(pg)
    shot(pg, "4_decode")

    go(pg, "Benchmarks")
    no_exception(pg)
    shot(pg, "5_benchmarks")

    go(pg, "GPU")
    no_exception(pg)
    shot(pg, "6_gpu")

    go(pg, "Rebuild")
    pg.get_by_role("button", name="Refresh and rebuild while decoding").click()
    pg.get_by_text("Rebuild time (median)").wait_for(timeout=120_000)
    wait_idle(pg)
    charts_rendered(pg, 2)
    no_exception(pg)
    shot(pg, "7_rebuild")
    assert time.time() - t0 < 180, f"the browser run took {time.time() - t0:.0f} s"
    assert REQUESTS and not outbound(REQUESTS), f"requests that leave the machine: {outbound(REQUESTS)[:5]}"


# ---------------------------------------------------------------------------- server files
SECRET = "S3CRET-root:x:0:0:root:/root:/bin/bash"
REFUSED = "no catalog file at that path inside the data folders"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """An extra data root with good, oversized and bomb catalogs; a secret file outside it."""
    base = tmp_path_factory.mktemp("files")
    root, outside = base / "team_data", base / "outside"
    root.mkdir(), outside.mkdir()
    (root / "good.csv").write_text("item_id,s1,s2\n" + "".join(f"{i},{i % 3},{i // 3}\n" for i in range(21)))
    (root / "many.csv").write_text("item_id,s1\n" + "".join(f"{i},{i}\n" for i in range(3000)))
    (root / "leaky.csv").write_text(f"item_id,s1\n1,0\n2,{SECRET}\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 8  # 8 titles of 4 MB: 32 MB decoded from a few KB of zstd
    pq.write_table(pa.table({"item_id": list(range(rows)), "s1": list(range(rows)),
                             "title": [SECRET[:4] + "a" * (4 * 2**20)] * rows}),
                   root / "bomb.parquet", compression="zstd", use_dictionary=False)
    assert (root / "bomb.parquet").stat().st_size < 2**20
    secret = outside / "secret.csv"
    secret.write_text(f"{SECRET}\n{SECRET}\n")
    (root / "escape.csv").symlink_to(secret)
    return root.resolve(), secret


@pytest.fixture(scope="module")
def guarded_page(playwright_driver, tmp_path_factory, files):
    env = {"ZEROGR_DATA_DIR": str(files[0]), "ZEROGR_MAX_ROWS": "2000", "ZEROGR_MAX_DECODED_MB": "8",
           "ZEROGR_CONFIG": str(files[0] / "no-settings.toml")}
    for url in _serve(tmp_path_factory, env):
        yield from _browse(playwright_driver, url)


def _server_path(pg, text: str) -> None:
    box = pg.get_by_label("Path of a catalog file on the server (CSV, TSV or Parquet)")
    box.fill(text)
    box.press("Enter")
    wait_idle(pg)


def _refused_and_kept(pg, expected: str) -> str:
    error = pg.locator('[data-testid="stAlertContentError"]').first
    error.wait_for()
    text = error.inner_text()
    assert expected in text, text
    assert "The catalog in use stays file: good.csv" in pg.get_by_text("The catalog in use stays").inner_text()
    assert pg.locator('[data-testid="stMetricValue"]').first.inner_text() == "21"
    html = pg.content()
    assert "S3CRET" not in html and "root:x:0" not in html and "/bin/bash" not in html
    no_exception(pg)
    return text


def test_server_files_in_browser(guarded_page, files):
    root, secret = files
    pg = guarded_page
    wait_idle(pg)
    pg.get_by_text("File on the server", exact=True).click()
    wait_idle(pg)
    assert "up to 2,000 rows and 8 MB decoded" in pg.locator("body").inner_text()
    assert str(root) in pg.locator("body").inner_text()
    # a file inside the extra root loads and becomes the catalog every page uses
    _server_path(pg, "good.csv")
    pg.get_by_text("Loaded file: good.csv").wait_for()
    assert pg.locator('[data-testid="stMetricValue"]').first.inner_text() == "21"
    # outside the root, `..` and a symbolic link out: one answer naming the roots, nothing about the file
    answers = set()
    for typed in (str(secret), f"{root}/../outside/secret.csv", "../outside/secret.csv", "escape.csv"):
        _server_path(pg, typed)
        answers.add(_refused_and_kept(pg, REFUSED))
    assert len(answers) == 1 and str(root) in answers.pop()
    _server_path(pg, str(root / "nothing-here.csv"))
    _refused_and_kept(pg, REFUSED)
    shot(pg, "1d_catalog_server_file_refused")
    # too many rows, and a decompression bomb: refused before they are decoded
    _server_path(pg, "many.csv")
    _refused_and_kept(pg, "many.csv: 3,000 rows, over the limit of 2,000 rows")
    _server_path(pg, "bomb.parquet")
    _refused_and_kept(pg, "bomb.parquet: decodes to 32 MB, over the limit of 8 MB decoded")
    # a bad cell in a server file: row and column, not the value
    _server_path(pg, "leaky.csv")
    _refused_and_kept(pg, "leaky.csv, row 2, column 's1': (value withheld) is not an integer")
