"""The kinds table (jobs.kinds): one declaration per job kind, and every kind the API names declared."""

import pytest
from rest_framework.exceptions import ValidationError

from executor.models import ModelKind
from jobs.kinds import KINDS
from jobs.api.serializers import JobCreateSerializer, JobSerializer
from jobs.models import Job, job_kinds


def test_every_job_kind_is_declared_once_and_the_table_is_the_columns_and_the_apis_list():
    assert all(kind.name == name for name, kind in KINDS.items())
    assert [name for name, _ in job_kinds()] == list(KINDS) == ["media", "report"]
    assert Job._meta.get_field("kind").choices == job_kinds()
    assert list(JobCreateSerializer().fields["kind"].choices) == list(KINDS)
    assert list(JobSerializer().fields["kind"].choices) == list(KINDS)


def test_a_kind_not_in_the_table_is_refused_at_create():
    field = JobCreateSerializer().fields["kind"]
    assert field.run_validation("report") == "report"
    with pytest.raises(ValidationError) as refused:
        field.run_validation("podcast")
    assert refused.value.detail[0].code == "invalid_choice"


def test_each_model_kind_serves_exactly_one_job_kind():
    # The create serializer refuses a model whose kind the job's kind does not list: a model kind listed by
    # two job kinds, or by none, would make a model usable twice or never.
    served = [model_kind for kind in KINDS.values() for model_kind in kind.model_kinds]
    assert sorted(served) == sorted(ModelKind.values)
