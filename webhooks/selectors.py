"""Reads of the delivery outbox for the operators' views and actions (operators.operations)."""

from django.db.models import QuerySet

from webhooks.models import Delivery


def deliveries_of_jobs(jobs: QuerySet) -> QuerySet:
    """Every delivery of the matching jobs, every run and event (receivers dedupe on webhook-id)."""
    return Delivery.objects.filter(job_id__in=jobs.values("id"))
