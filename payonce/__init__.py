"""payonce's release version: every answer of the web process names it (the `Payonce-Version` header,
config.version), and the client libraries carry the same number (clients/python/payonce_client/_version.py,
clients/typescript/package.json and src/version.ts; tests/project/test_version.py holds them together).
CHANGELOG.md says what each release changed and what a client or an operator must do about it;
deploy/previous-release names the release before this one (its version and commit)."""

__version__ = "0.43.0"
