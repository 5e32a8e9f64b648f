"""The frozen backbone and the prompted model around it (no Ray, MLflow or Optuna here).

``backbones`` loads Hugging Face models, tokenizers and their dimensions (cached per process);
``prompted`` wraps a backbone with a prompt method and a task head; ``build`` puts the two
together from an experiment's config.
"""
