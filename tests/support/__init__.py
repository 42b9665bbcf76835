"""The tests' helpers, one package imported one way from every test folder:
`from tests.support.X import ...` (pyproject's `pythonpath = ["."]` puts the checkout on sys.path).

paths: the checkout, its configs and the shared data beside it. compare_fixture, corpus_fixture,
fsdd_kaldi, wav_files: inputs (finished runs, the tone corpus, FSDD as Kaldi directories, WAV bytes).
dist_utils, strategy_harness, engine_fixture: gloo learners in processes and the trainers they run.
fault_jobs, full_disk: real jobs to inject faults into, a full disk. ctc_reference, per_check:
references the results are judged against. native_fixture: the native build without a compiler.
quick_loop_guard (+ quick_loop_site/): the quick loop's rule, installed by tests/conftest.py.
toy_strategy: a strategy in one file, copied into a copy of the package by e2e/test_toy_strategy.py.
"""
