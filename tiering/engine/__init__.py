"""The decision engine's pure core (no Django): features, the rules, the Random Forest and the choice of the
cheapest slice that meets a workload's target. ``tiering.services`` feeds it from PostgreSQL; ``bench/tiering.py``
from the performance model. Imports the standard library, ``gpus`` and (the forest only) scikit-learn/NumPy."""
