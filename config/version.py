"""The `Payonce-Version` header on every answer of the web process (docs/api.md): an ASGI layer outside all
but the request id's (config.asgi), so that the probes, static files and a body refused before Django name it
too."""

from payonce import __version__

HEADER = (b"payonce-version", __version__.encode())


class VersionHeaderMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_version(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), HEADER]}
            await send(message)

        return await self.app(scope, receive, send_with_version)
