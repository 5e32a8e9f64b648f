"""The ``tracking`` section: the MLflow store, where artefacts go, models and the registry,
system metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from raypeft.config.space import StrictModel

# Where MLflow can keep an experiment's artefacts: object stores and file systems every reader
# of the tracking store can reach (MLflow's artifact repositories; a plain absolute folder too)
ARTIFACT_SCHEMES = ("s3", "gs", "wasbs", "abfss", "hdfs", "sftp", "file", "mlflow-artifacts")


class TrackingConfig(StrictModel):
    uri: str | None = Field(
        None,
        description="MLflow tracking URI (default: sqlite:///mlflow.db): a sqlite file, a "
        "database server (postgresql+psycopg://user:password@host:5432/mlflow; postgresql:// "
        "means the same driver) or a tracking server (http://host:5000)",
    )
    artifact_location: str | None = Field(
        None,
        description="where an experiment the search creates keeps its artefacts (models, the "
        "experiment file): a URI every reader reaches (s3://bucket/mlflow) or an absolute "
        "folder. Default: a tracking server's --artifacts-destination; for a database URI, "
        "./mlruns where the search starts, on that machine's disk only. An existing "
        "experiment keeps the location it was created with",
    )
    experiment: str | None = Field(
        None, min_length=1, description="MLflow experiment name (default: name)"
    )
    # --- models, registry, system metrics (issue 16; see docs/serving.md) ---
    register_model: bool | str = Field(
        True,
        description="register the chosen trial's model in the MLflow Model Registry as a new "
        "version of this name; true: the experiment's name, false: do not register",
    )
    champion_alias: str | None = Field(
        "champion",
        min_length=1,
        description="registry alias of the best version (models:/NAME@champion); null: none",
    )
    champion_policy: Literal["if_better", "always", "never"] = Field(
        "if_better",
        description="when the alias moves to a new version: if_better (it beats the alias's "
        "version on the same validation metric and mode), always, or never",
    )
    log_models: Literal["best", "all"] = Field(
        "best",
        description="trial runs logged as MLflow python_function models (servable with "
        "mlflow models serve): the chosen trial only, or every finished trial",
    )
    system_metrics: bool = Field(
        True,
        description="MLflow system metrics (CPU, memory, disk, network; GPU with pynvml) on "
        "every trial run, sampled where the trial trains",
    )
    system_metrics_interval: float = Field(
        10.0, ge=0.5, description="seconds between two system-metric samples of a trial"
    )

    @field_validator("artifact_location")
    @classmethod
    def _artifact_uri(cls, value: str | None) -> str | None:
        if value is None:
            return value
        scheme, sep, rest = value.partition("://")
        if sep and (scheme.lower() not in ARTIFACT_SCHEMES or not rest.strip("/")):
            raise ValueError(
                f"must be a URI of an artifact store ({', '.join(ARTIFACT_SCHEMES)}) with a "
                f"location after '://', or an absolute folder, but got {value!r}"
            )
        if not sep and not Path(value).is_absolute():
            raise ValueError(
                "must be a URI (e.g. s3://bucket/mlflow) or an absolute folder (a relative one "
                f"would depend on where the search starts), but got {value!r}"
            )
        return value

    @field_validator("register_model")
    @classmethod
    def _registry_name(cls, value: bool | str) -> bool | str:
        if isinstance(value, str) and (not value.strip() or any(c in value for c in "/@:")):
            raise ValueError(
                f"a registered model name must be non-empty without '/', '@' or ':' (they "
                f"would break models:/NAME@alias URIs), but got {value!r}"
            )
        return value

    def registered_model_name(self, experiment: str) -> str | None:
        """The registry name the search registers under (None: not registered)."""
        if self.register_model is False:
            return None
        if self.register_model is True:
            return re.sub(r"[^A-Za-z0-9_.-]+", "-", experiment).strip("-") or "raypeft"
        return self.register_model
