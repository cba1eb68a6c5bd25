"""The engine: runs a job's recipe stage by stage, as Celery tasks (docs/architecture.md)."""
