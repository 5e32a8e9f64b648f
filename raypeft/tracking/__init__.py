"""MLflow: trial results become runs (``callback``), and runs are read back (``runs``)."""
