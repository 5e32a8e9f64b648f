"""Tasks: registry, loading (Hub, local files, packaged demo data), tokenisation, metrics."""

from raypeft.data.tasks import TASKS, TaskSpec, resolve_task_spec
from raypeft.data.tokenize import TokenizedTask, prepare_task

__all__ = ["TASKS", "TaskSpec", "TokenizedTask", "prepare_task", "resolve_task_spec"]
