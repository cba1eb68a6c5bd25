"""OpenAPI description of the Bearer API-key authentication (drf-spectacular extension)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerAPIKeyScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.auth.BearerAPIKeyAuthentication"
    name = "BearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <api_key>"}
