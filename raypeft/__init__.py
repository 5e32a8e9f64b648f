"""raypeft: distributed hyperparameter search for prompt-based parameter-efficient fine-tuning.

Ray Tune (driven by Optuna) explores the hyperparameters of prompt methods; Ray Train workers
train each trial on a frozen Hugging Face backbone; every trial is logged to MLflow.
"""

__version__ = "0.1.0"
