"""raypeft: distributed hyperparameter search for prompt-based parameter-efficient fine-tuning.

Ray Tune (driven by Optuna) explores the hyperparameters of prompt methods; Ray Train workers
train each trial on a frozen Hugging Face backbone; every trial is logged to MLflow.
"""

# The built-in methods register their configs with raypeft.config, which sits below them and
# never imports them: importing the package registers them, so every entry point (CLI, Ray
# workers, scripts) reads experiment files with every method known.
import raypeft.methods  # noqa: F401  (registration side effects)

__version__ = "0.1.0"
