"""OpenAPI description of the Bearer API-key authentication (drf-spectacular extension)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerAPIKeyScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.auth.BearerAPIKeyAuthentication"
    name = "BearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <api_key>"}


def report_fields_are_optional(result, generator, request, public):
    """drf-spectacular postprocessing hook: a job's `chapters` is there for reports only."""
    job = result.get("components", {}).get("schemas", {}).get("Job")
    if job and "chapters" in job.get("required", []):
        job["required"].remove("chapters")
    return result
