"""The pipeline planners: ESG for inference pipelines under an SLO, and model splits over GPUs.

Pure Python (standard library and ``gpus`` only), no Django, no I/O, like ``broker/scheduler``:
``esg.plan_esg(pipeline, prices)`` plans a DAG of inference stages (docs/pipelines.md), ``splits.plan_split``
cuts a model's layers over candidate GPUs; ``profiles`` turns a stage's architecture into its batch latency per GPU
slice. The models, their layer tables and the performance model are the catalogue's (``gpus.architectures``,
``gpus.layers``, ``gpus.performance``), the same ones auto-tiering uses. The ``pipelines`` Django app
stores the plans and leases them; ``bench/pipelines.py`` and ``bench/splits.py`` measure them.
"""
