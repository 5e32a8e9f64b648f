"""How well and how fast a search finds its answer: settings replayed against recorded
learning-curve tables (:mod:`~benchmarks.search.replay_study`, on the settings and rows of
:mod:`~benchmarks.search.replays`), the shipped default chosen and confirmed by them
(:mod:`~benchmarks.search.choose_default`), replays against real searches
(:mod:`~benchmarks.search.simulation_check`), budgets (:mod:`~benchmarks.search.budget_check`),
a table recorded in chunks (:mod:`~benchmarks.search.table_chunks`), and raypeft against
``Trainer.hyperparameter_search`` (:mod:`~benchmarks.search.peer_search`). docs/simulate.md,
docs/search_efficiency.md.
"""
