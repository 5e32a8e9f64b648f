"""Figures of ``raypeft simulate``: anytime regret against compute, and each replay's
compute and regret, one colour per replayed search file. They take plain numbers (the
simulation is computed in :mod:`raypeft.search.simulate`), and write PNGs."""

from __future__ import annotations

from pathlib import Path

from raypeft.reporting.drawing import PALETTE, _mpl


def draw_anytime(bands: dict[str, dict[str, list[float]]], out: Path) -> Path:
    """``bands``: per search, ``compute`` fractions and the ``median``, ``q25``, ``q75``
    regret over replays at each. The best-so-far regret against what the search spent."""
    fig = _mpl(7, 4.2)
    ax = fig.add_subplot()
    for i, (name, band) in enumerate(bands.items()):
        colour = PALETTE[i % len(PALETTE)]
        ax.plot(band["compute"], band["median"], color=colour, label=f"{name} (median)")
        ax.fill_between(band["compute"], band["q25"], band["q75"], color=colour, alpha=0.2)
    ax.set_xlabel("compute spent (trial-steps / full grid's)")
    ax.set_ylabel("regret of the choice so far (points)")
    ax.set_title("Anytime regret over replays: median, 25th-75th percentile band")
    return _finish(fig, ax, out / "anytime.png")


def draw_tradeoff(points: dict[str, list[tuple[float, float]]], out: Path) -> Path:
    """``points``: per search, each replay's (trial-steps / grid, regret in points)."""
    fig = _mpl(7, 4.2)
    ax = fig.add_subplot()
    for i, (name, pairs) in enumerate(points.items()):
        colour = PALETTE[i % len(PALETTE)]
        ax.scatter([p[0] for p in pairs], [p[1] for p in pairs], s=14, alpha=0.6,
                   color=colour, label=name)  # fmt: skip
    ax.set_xlabel("compute (trial-steps / full grid's)")
    ax.set_ylabel("regret of the chosen configuration (points)")
    ax.set_title("Each replay: what it spent and how far its choice is from the best")
    return _finish(fig, ax, out / "tradeoff.png")


def _finish(fig, ax, path: Path) -> Path:
    """The goal's lines (0.30 of the grid's compute, 0.5 points of regret), the legend, the
    PNG written."""
    ax.axvline(0.30, color="grey", linestyle=":", linewidth=1)
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path
