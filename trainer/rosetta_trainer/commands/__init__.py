"""The commands (train, prepare, stage, evaluate, translate, average, export, plan) and the pod's launcher: the top floor, which nothing in the trainer imports."""
