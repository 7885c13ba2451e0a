"""Worked Spark jobs over Deadline Queue; each runs with ``python -m pipeline.jobs.NAME``
or ``spark-submit pipeline/jobs/NAME.py`` (see ``docs/spark.md``)."""
