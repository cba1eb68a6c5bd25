"""The job API: the HTTP views, what they read and answer, and the OpenAPI document (docs/architecture.md)."""
