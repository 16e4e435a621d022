"""Hostile and malformed TranslationTrainings: the corpus (corpus/, generated.py) and how to read it (corpus.py).

tests/hostile/test_validate.py runs every document through `rosetta validate`;
tests/cluster/test_hostile_corpus.py applies them with kubectl to a cluster with the operator.
"""
