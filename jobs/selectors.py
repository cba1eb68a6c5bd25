"""Reads of the jobs tables for other modules (views, the serializers' checks, the executor)."""

from jobs.models import Job, JobStatus


def succeeded_output_keys(*, client_id, keys) -> set[str]:
    """Which of `keys` are outputs of the client's own succeeded jobs (one statement, on the claim's
    unique index): the only outputs a reference may name."""
    if not keys:
        return set()
    return set(
        Job.objects.filter(client_id=client_id, status=JobStatus.SUCCEEDED, output_key__in=list(keys))
        .values_list("output_key", flat=True)
    )


def job_holding_output_key(*, client_id, key: str):
    """The id of the client's job that claimed `key`, or None."""
    return Job.objects.filter(client_id=client_id, output_key=key).values_list("id", flat=True).first()
