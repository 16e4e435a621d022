"""Rosetta's Kubernetes operator: TranslationTraining → ConfigMap + JobSet, status mirrored back."""
