"""One search, from a validated experiment to its summary: Ray Tune driven by Optuna.

``run`` composes the phases (prepare, open records, fit, analyse, finish); ``space`` compiles
the search space; ``searcher`` is the Optuna searcher and its study; ``tuner`` builds and runs
the Tune experiments (scheduler, trial names, resuming); ``trial_runners`` run one trial
in-process or through Ray Train; ``results`` holds a trial's result as a small record;
``outcome`` chooses the best trial, the Pareto front and scores the test split; ``repeats``
re-trains the top configurations; ``interrupted`` finds a search to resume; ``progress``
prints the live table; ``ray_session`` starts or joins Ray; ``resources`` says what a trial
asks for and whether the cluster can give it.
"""
