"""Worked Spark jobs over Deadline Queue; each runs with ``python -m dq.pipeline.jobs.NAME``
or ``spark-submit pipeline/jobs/NAME.py`` (see ``docs/spark.md``)."""

__all__: list[str] = []
