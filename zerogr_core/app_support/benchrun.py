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

from ..errors import ZeroGRError, first_line


def app_suites() -> tuple[str, ...]:
    """The benchmark suites the app can run live (:data:`zerogr_core.bench.registry.APP_SUITES`)."""
    from ..bench.registry import APP_SUITES

    return APP_SUITES


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
