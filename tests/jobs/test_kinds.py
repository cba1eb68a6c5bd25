"""The kinds table (jobs.kinds): one declaration per job kind, and every kind the API names declared."""

from executor.models import ModelKind
from jobs.kinds import KINDS
from jobs.models import JobKind


def test_every_job_kind_is_declared_once():
    assert set(KINDS) == set(JobKind.values)
    assert all(kind.name == name for name, kind in KINDS.items())


def test_each_model_kind_serves_exactly_one_job_kind():
    # The create serializer refuses a model whose kind the job's kind does not list: a model kind listed by
    # two job kinds, or by none, would make a model usable twice or never.
    served = [model_kind for kind in KINDS.values() for model_kind in kind.model_kinds]
    assert sorted(served) == sorted(ModelKind.values)
