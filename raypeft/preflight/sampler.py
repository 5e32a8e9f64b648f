"""Notes, not errors: a model-based sampler that will draw every trial at random.

Optuna's TPE and GP samplers draw their first ``n_startup_trials`` trials at random (10 by
default) and model the results only after that many have ended. A search of no more trials
than that never models anything: ``sampler: tpe`` then behaves as ``random``, and a file that
says TPE chooses its keys says what does not happen (issue 42). ``validate`` prints it
beside the export notes; ``tune`` does not (a search of a few trials, as a quick check or a
test runs, is allowed to be random, and its own one-line errors stay one line).
"""

from __future__ import annotations

from raypeft.config.schema import ExperimentConfig
from raypeft.config.space import GridParam
from raypeft.search.study import startup_trials


def sampler_notes(cfg: ExperimentConfig) -> list[str]:
    """One note when a tpe or gp sampler has keys to draw but too few trials to model them."""
    search = cfg.search
    drawn = [key for key, entry in cfg.space.items() if not isinstance(entry, GridParam)]
    if search.sampler not in ("tpe", "gp") or not drawn:
        return []
    startup = startup_trials(cfg)
    if search.num_samples > startup:
        return []
    return [
        f"search.sampler: {search.sampler} draws its first {startup} trials at random "
        f"(search.startup_trials), so with num_samples {search.num_samples} it draws "
        f"{', '.join(drawn)} at random in every trial; raise num_samples past {startup} or "
        "lower startup_trials for it to model the results"
    ]
