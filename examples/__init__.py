"""Example trainers shipped with meshplan (``meshplan.examples``): ``train_gpt.py``, the entry script the torchrun,
Slurm and Kubeflow exports launch by default, and the tiny GPT-2 config it trains in the tests. ``meshplan
example-trainer PATH`` writes the trainer out of an installed package."""
