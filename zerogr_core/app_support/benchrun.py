"""A benchmark sweep run live from the app (GPU), through the bench command's own code path.

:class:`LiveSweep` parses the same arguments as ``python -m zerogr_core bench`` (so the app
and the CLI cannot drift apart), runs the :class:`~zerogr_core.bench.session.Session` in a
background thread, and exposes the records and log lines as they arrive so the page can
draw progress and partial charts. Results go to a folder of the caller's choice, never
over the committed ``runs/results``.
"""
from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from ..errors import CatalogError, ZeroGRError, first_line


def app_suites() -> tuple[str, ...]:
    """The benchmark suites the app can run live (:data:`zerogr_core.bench.registry.APP_SUITES`)."""
    from ..bench.registry import APP_SUITES

    return APP_SUITES


def live_scale(text: str, max_rows: int, what: str = "Scale (SIDs)", catalog: str | None = None) -> int | None:
    """The number of SIDs of a live sweep's synthetic catalog, at most ``max_rows``.

    Left empty, the bench command would take its preset's default (19,269,255 SIDs for
    search-like): for the suite's default catalog or a synthetic preset (``catalog``) whose
    default is over ``max_rows``, the sweep takes ``max_rows`` instead.

    Returns
    -------
    int or None
        The ``--scale`` to pass; ``None``: the bench command's default, within the limit (or a
        catalog that is no synthetic preset).

    Raises
    ------
    ZeroGRError
        Naming ``what``: not a whole number, or more SIDs than the app loads from a file
        (a synthetic catalog lives in the same host memory).
    """
    if not text.strip():
        from ..bench.workload import DEFAULT_SCALE

        defaults = DEFAULT_SCALE.values() if catalog is None else [DEFAULT_SCALE.get(catalog, 0)]
        return max_rows if max(defaults) > max_rows else None
    from ..catalog.samples import parse_count

    count = parse_count(text, what)
    if count > max_rows:
        raise ZeroGRError(f"{what}: {count:,} SIDs, over this app's limit of {max_rows:,} rows (the [limits] "
                          "of .streamlit/zerogr.toml or ZEROGR_MAX_ROWS); run larger sweeps with the bench command")
    return count


def live_catalog(text: str, settings) -> str | None:
    """The ``--catalog`` of a live sweep, from the page's *Catalog* field.

    A synthetic preset, a bundled sample or a ``synth:KIND:N`` spec is passed on (its size
    bounded by the load limits); anything else is a file, which is read under the same
    rules as the Catalog page's *File on the server*: below a data root, within the load
    limits, its values never quoted. The bench command itself reads any path with its
    user's rights, which the app, open to a team, must not offer.

    Parameters
    ----------
    text : str
        As typed; empty: the suite's default catalog (``None``).
    settings : AppSettings
        The app's data roots and load limits (:func:`~.sources.app_settings`).

    Returns
    -------
    str or None
        The argument to pass: the name or spec as typed, or the file's resolved path.

    Raises
    ------
    ZeroGRError
        One line naming the *Catalog* field (or the file, row and column).
    """
    from ..catalog.samples import FILE_SAMPLES, SAMPLES
    from ..catalog.synth import SYNTH_PRESETS
    from .sources import load_source, server_file_source

    name = text.strip()
    if not name:
        return None
    if name in SYNTH_PRESETS or name in SAMPLES or name in FILE_SAMPLES:
        return name
    if name.startswith("synth:"):
        parts = name.split(":")
        if len(parts) >= 3:  # a malformed spec gets the bench command's own answer
            live_scale(parts[2], settings.limits.max_rows, f"Catalog {name!r}")
        return name
    try:
        source = server_file_source(name, settings.roots)
        load_source(source, settings.limits)  # refused here, in one line, before the sweep starts
    except CatalogError as err:
        raise ZeroGRError(f"Catalog: {err}") from None
    return source.path


class LiveSweep:
    """One benchmark run in a background thread.

    Parameters
    ----------
    argv : list of str
        Arguments of ``python -m zerogr_core bench`` (``--suite``, ``--catalog``, ``--batch`` …);
        ``--json``/``--csv`` are set here.
    out_dir : path
        Where the run's JSON and CSV go.

    Raises
    ------
    ZeroGRError
        Arguments the bench command refuses (one line).
    """

    def __init__(self, argv: list[str], out_dir):
        from ..bench import commands
        from ..bench.rerun import run_command

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.json_path, self.csv_path = out / "live.json", out / "live.csv"
        parser = argparse.ArgumentParser(prog="zerogr", exit_on_error=False)
        sub = parser.add_subparsers()
        commands.register(sub)
        try:
            args = parser.parse_args(["bench", *argv, "--json", str(self.json_path), "--csv", str(self.csv_path)])
        except (argparse.ArgumentError, SystemExit) as err:
            raise ZeroGRError(f"benchmark arguments: {err}") from None
        self.options = commands.parse_options(args)
        self.command = run_command(self.options)
        self.lines: list[str] = []
        self.error: str | None = None
        self.started = None
        self.finished = None
        self._writer = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ running
    def start(self) -> "LiveSweep":
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="zerogr-live-bench", daemon=True)
        self._thread.start()
        return self

    def _log(self, line: str) -> None:
        self.lines.append(str(line))

    def _run(self) -> None:
        try:
            import torch

            from ..environment import environment
            from ..bench.results import ResultWriter
            from ..bench.session import Session

            if self.options.device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = False
            env = environment(self.options.device)
            env["argv"] = "app: live sweep"
            self._writer = ResultWriter(self.json_path, self.csv_path, env, self.command)
            Session(self.options, self._writer, env, self.command, log=self._log).run()
            self._writer.close()
        except BaseException as exc:  # reported to the page
            self.error = f"{type(exc).__name__}: {first_line(exc)}"
        finally:
            self.finished = time.perf_counter()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.done

    # ------------------------------------------------------------------ reading
    @property
    def done(self) -> bool:
        return self.finished is not None

    @property
    def records(self) -> list[dict]:
        return list(self._writer.records) if self._writer is not None else []

    @property
    def elapsed_s(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.perf_counter()) - self.started

    def fraction(self) -> float:
        """Progress in [0, 1]: elapsed over the time budget (capped below 1 until done)."""
        if self.done:
            return 1.0
        budget = self.options.budget_s
        if not budget:
            return min(0.95, len(self.records) / 50)
        return min(0.99, self.elapsed_s / budget)
