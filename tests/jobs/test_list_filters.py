"""GET /v1/jobs filters (docs/api.md, "Read, list, cancel and retry jobs"): by metadata pair and by creation
time, one client's jobs only, page links that keep the filters, and a clear 422 for a filter that cannot be
read."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job
from tests.conftest import media_body

pytestmark = pytest.mark.django_db


def ids(answer) -> list[str]:
    assert answer.status_code == 200, answer.content
    return [job["id"] for job in answer.json()["results"]]


def test_metadata_pairs_and_a_time_range_pick_the_clients_own_jobs(api, make_api):
    spring = [api.create(media_body(metadata={"campaign": "spring", "n": str(n)}), key=f"s{n}").json()["id"]
              for n in range(3)]
    autumn = api.create(media_body(metadata={"campaign": "autumn"}), key="a").json()["id"]
    numeric = api.create(media_body(metadata={"campaign": 7}), key="seven").json()["id"]
    bob = make_api("bob")
    bob.create(media_body(metadata={"campaign": "spring"}), key="bobs")

    assert ids(api.get("/v1/jobs", **{"metadata.campaign": "spring"})) == spring[::-1]
    assert ids(api.get("/v1/jobs", **{"metadata.campaign": "spring", "metadata.n": "1"})) == [spring[1]]
    assert ids(api.get("/v1/jobs", **{"metadata.campaign": "autumn"})) == [autumn]
    assert ids(api.get("/v1/jobs", **{"metadata.campaign": "7"})) == []  # a string value matches a string only
    assert numeric not in ids(api.get("/v1/jobs", **{"metadata.campaign": "spring"}))

    # Spread the jobs over three days: [after, before) picks the middle one.
    now = timezone.now()
    for days, job_id in zip((3, 2, 1), spring):
        Job.objects.filter(id=job_id).update(created_at=now - timedelta(days=days))
    middle = api.get("/v1/jobs", **{"metadata.campaign": "spring",
                                    "created_after": (now - timedelta(days=2, hours=1)).isoformat(),
                                    "created_before": (now - timedelta(days=1, hours=1)).isoformat()})
    assert ids(middle) == [spring[1]]
    # An offset's `+` sent unencoded arrives as a space; it is read as the `+` it was.
    plus = (now - timedelta(days=2, hours=1)).astimezone(timezone.get_fixed_timezone(60)).isoformat()
    assert "+01:00" in plus
    raw = api.http.get(f"/v1/jobs?metadata.campaign=spring&created_after={plus}", headers=api.headers())
    assert ids(raw) == spring[:0:-1]


def test_the_next_page_keeps_the_filters(api):
    for n in range(5):
        api.create(media_body(metadata={"batch": "b1" if n % 2 else "b2"}), key=f"k{n}")
    first = api.get("/v1/jobs", limit=1, **{"metadata.batch": "b2"})
    seen = ids(first)
    link = first.json()["next"]
    while link:
        page = api.http.get(link, headers=api.headers())
        seen += ids(page)
        link = page.json()["next"]
    assert len(seen) == 3 and len(set(seen)) == 3
    assert {Job.objects.get(id=job_id).metadata["batch"] for job_id in seen} == {"b2"}


@pytest.mark.parametrize("params, field", [
    ({"created_after": "yesterday"}, "created_after"),
    ({"created_before": "2026-12-01T00:00:00"}, "created_before"),  # no offset: which day is it?
    ({"created_after": "2026-13-40T00:00:00Z"}, "created_after"),
    ({"metadata.": "x"}, "metadata."),
    ({"metadata.k": "v" * 1001}, "metadata.k"),
    ({f"metadata.k{n}": "v" for n in range(11)}, "metadata"),
])
def test_a_filter_that_cannot_be_read_is_422_naming_it(api, params, field):
    answer = api.get("/v1/jobs", **params)
    assert answer.status_code == 422, answer.content
    assert field in answer.json()["error"]["fields"], answer.content
